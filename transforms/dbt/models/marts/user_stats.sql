{{ config(pre_hook="{{ replace_window('stat_date') }}") }}
-- Per active user and day: activity, clicks and the sequence length at the end of the day.
select
    added_date                                              as stat_date,
    user_id,
    count(*) filter (where event_kind = 'impression')       as impressions,
    coalesce(sum(label) filter (where event_kind = 'impression'), 0) as clicks,
    count(*) filter (where event_kind = 'behavior')         as behaviors,
    min(ts_ms)                                              as first_ts_ms,
    max(ts_ms)                                              as last_ts_ms,
    max(seq_index)                                          as sequence_length
from {{ ref('user_sequences') }}
where added_date between {{ start_date() }} and {{ end_date() }}
group by all
