"""The long-running Kafka consumer-group service (``gpuwarden serve``)."""
