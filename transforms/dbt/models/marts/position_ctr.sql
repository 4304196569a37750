{{ config(pre_hook="{{ replace_window('as_of_date') }}") }}
-- Historical CTR per surface x position for each day D of the window, over the trailing
-- position_ctr_window_days days ending D-1 (never D itself: no label of D leaks into D's buckets).
with days as (
    select cast(unnest(generate_series({{ start_date() }}, {{ end_date() }}, interval 1 day)) as date) as as_of_date
),
history as (
    select event_date, surface, position, count(*) as impressions, sum(label) as clicks
    from {{ ref('stg_events') }}
    where event_kind = 'impression'
      and event_date between {{ start_date() }} - {{ var('position_ctr_window_days') }} and {{ end_date() }} - 1
    group by all
)
select
    d.as_of_date,
    h.surface,
    h.position,
    sum(h.impressions)                           as impressions,
    sum(h.clicks)                                as clicks,
    sum(h.clicks) / sum(h.impressions)           as ctr
from days d
join history h
  on h.event_date between d.as_of_date - {{ var('position_ctr_window_days') }} and d.as_of_date - 1
group by all
