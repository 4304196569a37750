{# The partition window of this invocation, as DATE literals. #}
{% macro start_date() %}cast('{{ var("start_date") }}' as date){% endmacro %}
{% macro end_date() %}cast('{{ var("end_date") }}' as date){% endmacro %}

{# Makes a rerun of [start_date, end_date] replace exactly those days: delete them before the append. #}
{% macro replace_window(date_column) %}
  {% if is_incremental() %}
    delete from {{ this }} where {{ date_column }} between {{ start_date() }} and {{ end_date() }}
  {% else %}
    select 1
  {% endif %}
{% endmacro %}

{# contracts.ITEM_STAT_WINDOWS_DAYS and ITEM_STAT_LAG_DAYS (the contract's column names carry the windows). #}
{% macro item_stat_windows() %}{{ return([7, 28]) }}{% endmacro %}
{% macro item_stat_lag() %}{{ return(2) }}{% endmacro %}
