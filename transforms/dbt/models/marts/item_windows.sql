{%- set windows = item_stat_windows() -%}
{%- set lag = item_stat_lag() -%}
{{ config(pre_hook="{% if is_incremental() %}delete from {{ this }} where as_of_date between {{ start_date() }} and {{ end_date() }} + 1{% endif %}") }}
-- Item statistics as a request on day D can know them: per ad and per campaign, impressions and clicks of
-- every user over trailing windows of days ending D-2 (the run of D-1 ends only after D's files land, so
-- D-2 is the newest whole day serving holds). Built for the window's days and for the day after it, which
-- the online store serves once this run publishes (deploy/sequence_store.py). A rerun of D changes D's
-- item_stats, which later days count: the window always runs to the last built day (transforms/sequences.py).
with days as (
    select cast(unnest(generate_series({{ start_date() }}, {{ end_date() }} + 1, interval 1 day)) as date) as as_of_date
),
counted as (
    select stat_date, ad_id, campaign_id, impressions, clicks
    from {{ ref('item_stats') }}
    where stat_date between {{ start_date() }} - {{ lag + windows | max - 1 }} and {{ end_date() }} + 1 - {{ lag }}
),
per_day as (
    select stat_date, 'ad' as level, ad_id as key, sum(impressions) as impressions, sum(clicks) as clicks
    from counted where ad_id is not null group by all
    union all
    select stat_date, 'campaign' as level, campaign_id as key, sum(impressions), sum(clicks)
    from counted where campaign_id is not null group by all
)
select
    d.as_of_date,
    p.level,
    p.key,
    {%- for w in windows %}
    cast(coalesce(sum(p.impressions) filter (where p.stat_date > d.as_of_date - {{ lag + w }}), 0) as bigint) as impressions_{{ w }}d,
    cast(coalesce(sum(p.clicks) filter (where p.stat_date > d.as_of_date - {{ lag + w }}), 0) as bigint)      as clicks_{{ w }}d{{ "," if not loop.last }}
    {%- endfor %}
from days d
join per_day p
  on p.stat_date between d.as_of_date - {{ lag + windows | max - 1 }} and d.as_of_date - {{ lag }}
group by all
