{{ config(
    pre_hook=[
        "create table if not exists {{ this.schema }}.user_heads (user_id varchar, as_of_date date, head bigint)",
        "{% if is_incremental() %}delete from {{ this }} where added_date >= {{ start_date() }}{% endif %}",
        "{% if is_incremental() %}delete from {{ this.schema }}.user_heads where as_of_date >= {{ start_date() }}{% else %}delete from {{ this.schema }}.user_heads{% endif %}",
    ],
    post_hook=[
        "insert into {{ this.schema }}.user_heads select user_id, added_date, max(seq_index) from {{ this }} where added_date between {{ start_date() }} and {{ end_date() }} group by all",
    ],
) }}
-- The daily incremental sequence store: every user's events in a strict order, one row per event.
-- state(D) = trim_to_max_len(state(D-1) ++ events(D)): a day appends its events after the user's
-- head (seq_index continues from the head as of the day before the window); nothing before the
-- window is read but the small user_heads table (user, day, head), kept by this model's hooks, so the
-- cost of a day does not grow with the history. The trim is logical: state(D) of a user is the rows
-- with added_date <= D and seq_index > length(D) - max_seq_len. Rebuilding day D deletes D and every
-- later day (their indexes depend on D), so a range rebuild always runs to the last built day
-- (transforms/sequences.py extends the window).
with heads as (
    {% if is_incremental() %}
    select user_id, arg_max(head, as_of_date) as head
    from {{ this.schema }}.user_heads
    where as_of_date < {{ start_date() }}
    group by user_id
    {% else %}
    select null::varchar as user_id, 0::bigint as head where false
    {% endif %}
),
new_events as (
    select *
    from {{ ref('stg_events') }}
    where event_date between {{ start_date() }} and {{ end_date() }}
)
select
    e.user_id,
    coalesce(h.head, 0)
      + row_number() over (partition by e.user_id order by e.ts_ms, e.kind_order, e.tie_key) as seq_index,
    e.event_date as added_date,
    e.ts_ms, e.event_kind, e.request_id, e.impression_id, e.item_id, e.campaign_id, e.advertiser_id,
    e.category_id, e.brand_id, e.position, e.surface, e.device, e.action, e.label, e.click_type, e.dwell_ms
from new_events e
left join heads h using (user_id)
order by e.user_id, seq_index
