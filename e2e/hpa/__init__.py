"""What runs beside the local cluster for the HPA: the real Prometheus scraping what the
ServiceMonitors select, the real prometheus-adapter serving the chart's rules, and a watch
of the HPA controller. Used by the e2e scenarios and by `make autoscale` (lab/autoscale)."""
