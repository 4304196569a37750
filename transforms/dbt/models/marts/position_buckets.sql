{{ config(pre_hook="{{ replace_window('as_of_date') }}") }}
-- K buckets of positions per surface for each day, by historical CTR (CADET: one output head per
-- bucket). Positions are ranked by CTR, best first, and cut where the cumulative impression share
-- crosses k/K, so buckets carry comparable traffic. A surface x position with no history yet (the
-- first day of the data) falls back to slot order: bucket floor(K * (position - 1) / max_position).
with days as (
    select cast(unnest(generate_series({{ start_date() }}, {{ end_date() }}, interval 1 day)) as date) as as_of_date
),
slots as (
    select distinct e.event_date as as_of_date, e.surface, e.position
    from {{ ref('stg_events') }} e
    where e.event_kind = 'impression' and e.event_date between {{ start_date() }} and {{ end_date() }}
    union
    select as_of_date, surface, position from {{ ref('position_ctr') }}
    where as_of_date between {{ start_date() }} and {{ end_date() }}
),
ranked as (
    select
        s.as_of_date, s.surface, s.position, p.ctr, p.impressions,
        coalesce(sum(p.impressions) over (partition by s.as_of_date, s.surface order by p.ctr desc, s.position
                 rows between unbounded preceding and 1 preceding), 0)
            / nullif(sum(p.impressions) over (partition by s.as_of_date, s.surface), 0)   as share_before,
        max(s.position) over (partition by s.as_of_date, s.surface)                       as max_position
    from slots s
    left join {{ ref('position_ctr') }} p
      on p.as_of_date = s.as_of_date and p.surface = s.surface and p.position = s.position
)
select
    as_of_date,
    surface,
    position,
    ctr                                                   as historical_ctr,
    impressions                                           as historical_impressions,
    cast(case
        when ctr is null then least({{ var('n_position_buckets') }} - 1,
                                    floor({{ var('n_position_buckets') }} * (position - 1) / max_position))
        else least({{ var('n_position_buckets') }} - 1, floor({{ var('n_position_buckets') }} * share_before))
    end as integer)                                       as position_bucket
from ranked
