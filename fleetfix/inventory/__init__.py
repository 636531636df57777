"""What fleetfix acts on, resolved once: the inventory file (model, load), Proxmox discovery, `--limit`
selection (select), and what a command asks for (request) -> its targets (resolve).

    resolution = resolve_targets(TargetRequest(inventory="inventory.yaml", limit="tag:training"))
    resolution.targets, resolution.skipped, resolution.warnings

Import from the modules themselves: this package file stays empty so that the light ones (request) do
not pull in the models.
"""
