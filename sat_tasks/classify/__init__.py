"""Failure classification: tell hardware faults, preemptions, image and user errors apart.

`ended` (who ended the process, decided first from the record's structured fields),
`catalogues` (each vendor's codes, classified once, with source and version), `rules`
(what is known: log-line rules built from them, Kubernetes words), `evidence`
(applying them to a record), `classifier` (weighing the findings into a Verdict),
`multirank` (which rank speaks for a multi-node attempt), `loaders` (records from pods
and files). Pure Python: no Airflow, no Kubernetes client.
"""

from sat_tasks.classify.catalogues import CATALOGUES, Catalogue, Fault
from sat_tasks.classify.classifier import Explanation, classify, explain, node_evidence
from sat_tasks.classify.ended import INTERRUPTED, Ender, WhoEnded, who_ended
from sat_tasks.classify.loaders import (
    UnreadableInput,
    job_and_attempt_of_pod,
    load_record,
    load_record_with_notes,
    record_from_pod,
)
from sat_tasks.classify.multirank import combine_rank_records
from sat_tasks.classify.rules import (
    APPLICATION_XIDS,
    CUDA_ERRORS,
    HARDWARE_XIDS,
    NOT_A_NODE_FAULT_XIDS,
    PEER_STOP_REASON,
)
from sat_tasks.core.handoffs import Verdict, VerdictKind

__all__ = [
    "APPLICATION_XIDS",
    "CATALOGUES",
    "CUDA_ERRORS",
    "HARDWARE_XIDS",
    "INTERRUPTED",
    "NOT_A_NODE_FAULT_XIDS",
    "PEER_STOP_REASON",
    "Catalogue",
    "Ender",
    "Explanation",
    "Fault",
    "UnreadableInput",
    "Verdict",
    "VerdictKind",
    "WhoEnded",
    "classify",
    "combine_rank_records",
    "explain",
    "job_and_attempt_of_pod",
    "load_record",
    "load_record_with_notes",
    "node_evidence",
    "record_from_pod",
    "who_ended",
]
