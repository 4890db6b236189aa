"""soakd's Grafana dashboards as code: ``python grafana/build.py`` writes grafana/dashboards/."""
