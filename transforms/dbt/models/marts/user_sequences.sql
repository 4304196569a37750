{{ config(pre_hook="{% if is_incremental() %}delete from {{ this }} where added_date >= {{ start_date() }}{% endif %}") }}
-- The daily incremental sequence store: every user's events in a strict order, one row per event.
-- state(D) = trim_to_max_len(state(D-1) ++ events(D)): a day appends its events after the user's
-- head (seq_index continues from the last index before the window); nothing before the window is
-- read except the per-user head. The trim is logical: state(D) of a user is the rows with
-- added_date <= D and seq_index > length(D) - max_seq_len (macro sequence_state). Rebuilding day D
-- deletes D and every later day (their indexes depend on D), so a range rebuild always runs to the
-- last built day (transforms/sequences.py extends the window).
with heads as (
    {% if is_incremental() %}
    select user_id, max(seq_index) as head
    from {{ this }}
    where added_date < {{ start_date() }}
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
