-- One row per event of the lake, typed, with the deterministic in-user order key.
-- Impressions sort before behaviors at the same millisecond, then by impression_id / item+action.
select
    cast("date" as date)                                        as event_date,
    cast(user_id as varchar)                                    as user_id,
    cast(ts_ms as bigint)                                       as ts_ms,
    cast(event_kind as varchar)                                 as event_kind,
    cast(request_id as varchar)                                 as request_id,
    cast(impression_id as varchar)                              as impression_id,
    cast(item_id as varchar)                                    as item_id,
    cast(campaign_id as varchar)                                as campaign_id,
    cast(advertiser_id as varchar)                              as advertiser_id,
    cast(category_id as varchar)                                as category_id,
    cast(brand_id as varchar)                                   as brand_id,
    cast(position as integer)                                   as position,
    cast(surface as varchar)                                    as surface,
    cast(device as varchar)                                     as device,
    cast(action as varchar)                                     as action,
    cast(label as tinyint)                                      as label,
    cast(click_type as varchar)                                 as click_type,
    cast(dwell_ms as bigint)                                    as dwell_ms,
    case when event_kind = 'impression' then 0 else 1 end      as kind_order,
    coalesce(cast(impression_id as varchar), cast(item_id as varchar) || '|' || cast(action as varchar)) as tie_key
from {{ source('lake', 'events') }}
