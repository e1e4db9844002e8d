"""The Training Jobs view: its app (`app`, one router per resource in `routers`), data (`jobs`) and pages (`templates`)."""
