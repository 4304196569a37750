"""The registry's pyfunc model, logged as code (MLflow models-from-code): loading a version runs this
file and reads the safetensors checkpoint; no Python object is pickled into or out of the registry."""

import tempfile
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.pyfunc import PythonModel


class GenrankModel(PythonModel):
    """Scores a training-samples-shaped DataFrame with the version's checkpoint."""

    def load_context(self, context) -> None:
        from models import load_model

        self.model = load_model(context.artifacts["checkpoint"])

    def predict(self, context, model_input: pd.DataFrame, params=None) -> pd.DataFrame:
        from models import predict

        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "part-0.parquet"
            model_input.to_parquet(path, index=False)
            out = predict(self.model, str(path))
        return out.drop(columns=["user_id"])


mlflow.models.set_model(GenrankModel())
