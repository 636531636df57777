"""Python wheels on the controller: the cache and who built what (cache), reading a wheel within bounds
(archive), the operator's wheel lock (lock), upstream's release wheels (release) fetched over HTTPS
(httpfetch), and the source archives the controller hands builders (source). The `wheels` step that
uses them is playbook/wheels.py; `fleetfix wheels` is cli/wheels.py (docs/extensions.md)."""
