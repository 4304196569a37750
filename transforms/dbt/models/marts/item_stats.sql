{{ config(pre_hook="{{ replace_window('stat_date') }}") }}
-- Per ad, campaign and day (an ad normally runs in one campaign): impressions, clicks, CTR, distinct users.
-- item_windows sums trailing windows of it per ad and per campaign.
select
    event_date                         as stat_date,
    item_id                            as ad_id,
    campaign_id,
    any_value(category_id)             as category_id,
    any_value(brand_id)                as brand_id,
    count(*)                           as impressions,
    sum(label)                         as clicks,
    sum(label) / count(*)              as ctr,
    count(distinct user_id)            as users
from {{ ref('stg_events') }}
where event_kind = 'impression' and event_date between {{ start_date() }} and {{ end_date() }}
group by all
