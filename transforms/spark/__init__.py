"""PySpark log aggregation: the ``events`` job (landing zone -> event lake + quarantine).

Library code only (no Dagster): :mod:`transforms.spark.session` builds the SparkSession,
:mod:`transforms.spark.events` holds the pure DataFrame -> DataFrame steps and the job entry
:func:`transforms.spark.events.run_events_job`.
"""
