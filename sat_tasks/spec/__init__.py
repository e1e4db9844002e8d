"""The Training Job spec: the model (`model`), reading and validating files (`loading`), quantities and URIs."""

from sat_tasks.spec.loading import (
    SpecError,
    SpecFileErrors,
    SpecProblem,
    dag_id_for,
    job_schema,
    load_spec,
    parse_spec,
)
from sat_tasks.spec.model import (
    GRACE_ENV,
    MAX_GRACE_SECONDS,
    SERVER_TYPES,
    BackendKind,
    DataSource,
    Fault,
    FaultKind,
    Framework,
    Image,
    LearningType,
    Resources,
    Results,
    SpotPolicy,
    Storage,
    TrainingJob,
)
from sat_tasks.spec.uris import check_s3_uri, split_s3_uri

__all__ = [
    "GRACE_ENV", "MAX_GRACE_SECONDS", "SERVER_TYPES", "BackendKind", "DataSource", "Fault", "FaultKind", "Framework",
    "Image", "LearningType", "Resources", "Results", "SpecError", "SpecFileErrors", "SpecProblem", "SpotPolicy",
    "Storage", "TrainingJob", "check_s3_uri", "dag_id_for", "job_schema", "load_spec", "parse_spec", "split_s3_uri",
]
