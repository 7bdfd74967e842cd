"""The operator's live room: reading the serving fleet's metrics. PromQL and the metrics source (metrics.py), the
pooled reads (metrics_reads.py), the bounded Prometheus client (prometheus_http.py), the Prometheus URL policy
(url_policy.py) and the status read-out text (readout.py). The replan interval that uses them is
operator/live_replan.py."""
