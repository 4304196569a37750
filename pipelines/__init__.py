"""The Dagster code location of genrank (``pipelines.definitions``) and the ``genrank`` command."""
