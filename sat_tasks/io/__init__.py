"""What SAT reads and writes outside itself: Object Storage (S3Hook), the run's layout there and on disk,
the image registry check, staging and data validation (Great Expectations)."""
