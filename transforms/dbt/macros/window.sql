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
