{{ config(pre_hook="{{ replace_window('sample_date') }}") }}
-- One sample per (user active on D, D): the user's state as of the end of D-1 (at most
-- max_seq_len events) followed by D's events. Targets are D's impressions: each carries its label,
-- position, position bucket (as of D) and request id. History impressions carry the bucket of their
-- own day. Targets also carry their ad's and campaign's item statistics as of D (item_windows; zero counts for
-- an id never shown in the windows), history rows none. Flat layout, one row per event, contiguous per user,
-- ordered by (user_id, event_rank).
{%- set stats = [] -%}
{%- for level in ['ad', 'campaign'] -%}{%- for w in item_stat_windows() -%}{%- for count in ['impressions', 'clicks'] -%}
{%- do stats.append((level, count ~ '_' ~ w ~ 'd')) -%}
{%- endfor -%}{%- endfor -%}{%- endfor %}
with day_events as (
    select user_id, added_date as sample_date, min(seq_index) - 1 as history_length
    from {{ ref('user_sequences') }}
    where added_date between {{ start_date() }} and {{ end_date() }}
    group by all
),
rows as (
    select
        d.sample_date, s.*
    from day_events d
    join {{ ref('user_sequences') }} s
      on s.user_id = d.user_id
     and s.added_date <= d.sample_date
     and s.seq_index > d.history_length - {{ var('max_seq_len') }}
),
flagged as (
    select *, (event_kind = 'impression' and added_date = sample_date) as is_target from rows
)
select
    r.sample_date,
    r.user_id,
    r.ts_ms,
    r.seq_index                                                  as event_rank,
    r.is_target,
    r.event_kind,
    r.item_id, r.campaign_id, r.advertiser_id, r.category_id, r.brand_id,
    r.surface, r.device, r.action, r.position,
    b.position_bucket,
    r.label, r.click_type, r.dwell_ms, r.request_id, r.impression_id,
    r.added_date                                                 as event_date,
    {%- for level, column in stats %}
    case when r.is_target then cast(coalesce({{ level }}.{{ column }}, 0) as bigint) end as {{ level }}_{{ column }}{{ "," if not loop.last }}
    {%- endfor %}
from flagged r
left join {{ ref('position_buckets') }} b
  on b.as_of_date = r.added_date and b.surface = r.surface and b.position = r.position
left join {{ ref('item_windows') }} ad
  on r.is_target and ad.as_of_date = r.sample_date and ad.level = 'ad' and ad.key = r.item_id
left join {{ ref('item_windows') }} campaign
  on r.is_target and campaign.as_of_date = r.sample_date and campaign.level = 'campaign' and campaign.key = r.campaign_id
order by r.sample_date, r.user_id, event_rank
