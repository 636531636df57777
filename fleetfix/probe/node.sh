# fleetfix node facts: run on a Proxmox node itself (once per node, shared by its containers).
# Prints a header line, then "key<TAB>value" lines. Read-only; exits 0 when the driver is absent.
# /proc/driver/nvidia/version is the host kernel module's version, which every container's
# userspace driver libraries must match exactly (DOMAIN.md 5.1).
main() {
    R=${FLEETFIX_PROBE_ROOT:-}
    printf 'fleetfix-node-facts 1\n'
    printf 'hostname\t%s\n' "$(uname -n 2>/dev/null)"
    if [ -r "$R/proc/driver/nvidia/version" ]; then
        while IFS= read -r _line || [ -n "$_line" ]; do
            case $_line in NVRM*) printf 'nvrm\t%s\n' "$_line" ;; esac
        done <"$R/proc/driver/nvidia/version"
    fi
}
main </dev/null
exit 0
