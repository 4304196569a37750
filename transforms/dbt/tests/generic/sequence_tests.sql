{# Rows of a sequence table whose order key does not strictly increase along (ts_ms, rank) per user. #}
{% test strictly_time_ordered(model, column_name, partition_by, order_by) %}
with ordered as (
    select
        {{ column_name }} as ts,
        lag({{ column_name }}) over (partition by {{ partition_by }} order by {{ order_by }}) as previous_ts,
        {{ order_by }} as rank_value,
        lag({{ order_by }}) over (partition by {{ partition_by }} order by {{ order_by }}) as previous_rank
    from {{ model }}
)
select * from ordered
where previous_ts is not null and (ts < previous_ts or rank_value = previous_rank)
{% endtest %}

{# Samples longer than max_seq_len history events plus their day's events. #}
{% test history_within_max_len(model, column_name) %}
select sample_date, user_id, count(*) filter (where not is_target and event_date < sample_date) as history
from {{ model }}
group by all
having count(*) filter (where not is_target and event_date < sample_date) > {{ var('max_seq_len') }}
{% endtest %}

{# History events (earlier days) at or after the sample's first target: future leakage. #}
{% test no_history_at_or_after_target(model, column_name) %}
with first_target as (
    select sample_date, user_id, min(ts_ms) as first_target_ts
    from {{ model }} where is_target group by all
)
select m.*
from (select * from {{ model }}) m join first_target t using (sample_date, user_id)
where m.event_date < m.sample_date and m.ts_ms >= t.first_target_ts
{% endtest %}
