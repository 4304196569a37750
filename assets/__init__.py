"""Dagster asset definitions, one module per stage. Thin glue over transforms/, models/, quality/, deploy/."""
