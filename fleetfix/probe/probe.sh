# fleetfix probe: prints ONE JSON document describing this machine's GPU software stack.
#
# Run as `/bin/sh -s` with this script on stdin. POSIX sh (dash, busybox ash, bash all work).
# Read-only: it never writes a file, never imports torch unless FLEETFIX_DEEP=1, and exits 0
# even when tools are missing (a missing python, dpkg or nvidia-smi is a fact, not an error).
#
# Parameters (prepended by fleetfix.probe.script.build_probe_script, all shell-quoted there):
#   FLEETFIX_DEEP=0|1          1 = import torch and the compiled extensions in subprocesses
#   set -- PYTHON...           the interpreters to inspect (default: python3)
#   FLEETFIX_PYTHONS_GIVEN=1   "the list above is deliberate", even when it is empty
#   FLEETFIX_DISCOVER=0|1      1 (default) = also look for torch envs elsewhere and inspect each one found
#                              like the named ones; 0 = the list above is the whole list (inventory `pythons`)
#   FLEETFIX_PROBE_ROOT=DIR    tests only: read files below DIR instead of / (reported paths stay /...)
#   FLEETFIX_PROBE_TIMEOUT=S   seconds any one external tool (nvcc, nvidia-smi) may take (default 20)
#   FLEETFIX_PROBE_EXTRA_PATH  tests only: what is appended to PATH (default /usr/local/sbin:/usr/local/bin)
#
# Everything lives in main(): the shell must parse the whole script before running any of it, so
# that main's stdin can be /dev/null. Otherwise a child that reads stdin would eat the rest of the
# script that `sh -s` is still reading from the same pipe.

main() {
LC_ALL=C
export LC_ALL
R=${FLEETFIX_PROBE_ROOT:-}
DEEP=${FLEETFIX_DEEP:-0}
ORIG_PATH=$PATH
# pct exec forces PATH=/sbin:/bin:/usr/sbin:/usr/bin, but pip puts ninja (and some pythons live)
# in /usr/local/bin, so tools are looked up there too. "nvcc on PATH" is still judged with the
# caller's PATH (ORIG_PATH). Tests set FLEETFIX_PROBE_EXTRA_PATH= (empty) to stay hermetic.
PATH=$PATH:${FLEETFIX_PROBE_EXTRA_PATH-/usr/local/sbin:/usr/local/bin}
export PATH
NL='
'
TAB='	'
if have timeout; then HAVE_TIMEOUT=1; else HAVE_TIMEOUT=; fi
TOOL_TIMEOUT=${FLEETFIX_PROBE_TIMEOUT:-20}
if [ -z "${FLEETFIX_PYTHONS_GIVEN:-}" ] && [ $# -eq 0 ]; then set -- python3; fi

read_uname
printf '{"fleetfix_probe":1,"deep":'; jb "$DEEP"
printf ',"hostname":'; jn "$UNAME_N"
printf ',"kernel":'; jn "$UNAME_R"
printf ',"os":'; probe_os
printf ',"apt":'; probe_apt
printf ',"dpkg":'; probe_dpkg
printf ',"cuda":'; probe_cuda
printf ',"pythons":['
SEP=
for py in "$@"; do
    printf '%s' "$SEP"; SEP=,
    probe_python "$py"
done
DISCOVERED=
[ "${FLEETFIX_DISCOVER:-1}" = 1 ] && discover_pythons
inspect_discovered "$@"
printf ']'
emit_discovered
printf ',"gpu":'; probe_gpu
printf ',"build":'; probe_build
printf '}\n'
}

# ---------------------------------------------------------------- JSON helpers
have() { command -v "$1" >/dev/null 2>&1; }

# The probe runs in every container of a fleet, so it forks as little as it can: each fork+exec costs
# the container CPU, and a stock Debian would otherwise need about a hundred of them.

# read_uname -> UNAME_N (node name), UNAME_R (kernel release), UNAME_M (machine), from one uname(1):
# it prints them in that order whatever the order of the flags, and none contains a space.
read_uname() {
    set -f; set -- $(uname -n -r -m 2>/dev/null); set +f
    UNAME_N=${1:-}; UNAME_R=${2:-}; UNAME_M=${3:-}
}

# run_t SECONDS CMD...: bounded, so a wedged tool (nvidia-smi on a hung GPU) cannot hang the probe.
run_t() {
    _secs=$1; shift
    if [ -n "$HAVE_TIMEOUT" ]; then timeout "$_secs" "$@"; else "$@"; fi
}

# js VALUE: VALUE as a JSON string. Plain printable ASCII (nearly every value) takes the fork-free
# path; anything else is made safe by sed: backslash and quote escaped, control characters and
# non-ASCII bytes replaced, so the document is always valid ASCII JSON whatever the target prints.
js() {
    case $1 in
        *[![:print:]]* | *[\\\"]*)
            printf '"%s"' "$(printf '%s' "$1" | tr '\t\r\n' '   ' | sed -e 's/[\\"]/\\&/g' -e 's/[^ -~]/?/g')" ;;
        *) printf '"%s"' "$1" ;;
    esac
}
jn() { if [ -n "$1" ]; then js "$1"; else printf null; fi; }         # string or null
jb() { if [ "$1" = 1 ]; then printf true; else printf false; fi; }   # 1 -> true, else false
ji() { case $1 in '' | *[!0-9]*) printf null ;; *) printf '%s' "$1" ;; esac; }   # integer or null

# unquote VALUE -> UNQ: strip one pair of surrounding quotes (os-release values).
unquote() {
    UNQ=$1
    case $UNQ in
        \"*\") UNQ=${UNQ#\"}; UNQ=${UNQ%\"} ;;
        \'*\') UNQ=${UNQ#\'}; UNQ=${UNQ%\'} ;;
    esac
}

# trim VALUE -> TRIM: strip leading and trailing blanks.
trim() {
    TRIM=${1#"${1%%[![:space:]]*}"}
    TRIM=${TRIM%"${TRIM##*[![:space:]]}"}
}

# ---------------------------------------------------------------- os
probe_os() {
    os_id=; os_ver=; os_code=; os_pretty=; os_like=
    _f=$R/etc/os-release
    [ -r "$_f" ] || _f=$R/usr/lib/os-release
    if [ -r "$_f" ]; then
        while IFS= read -r _l || [ -n "$_l" ]; do
            unquote "${_l#*=}"
            case $_l in
                ID=*) os_id=$UNQ ;;
                ID_LIKE=*) os_like=$UNQ ;;
                VERSION_ID=*) os_ver=$UNQ ;;
                VERSION_CODENAME=*) os_code=$UNQ ;;
                UBUNTU_CODENAME=*) [ -n "$os_code" ] || os_code=$UNQ ;;
                PRETTY_NAME=*) os_pretty=$UNQ ;;
            esac
        done <"$_f"
    fi
    printf '{"id":'; jn "$os_id"
    printf ',"id_like":'; jn "$os_like"
    printf ',"version_id":'; jn "$os_ver"
    printf ',"codename":'; jn "$os_code"
    printf ',"pretty_name":'; jn "$os_pretty"
    printf ',"machine":'; jn "$UNAME_M"
    printf '}'
}

# ---------------------------------------------------------------- apt
# Installed packages we care about, in one dpkg-query call: "name<TAB>version" lines. Installed: a status
# of "<want> ok installed" (held, or selected for removal, still counts; "reinstreq" is broken).
read_packages() {
    PKGS=
    have dpkg-query || return 0
    PKGS=$(dpkg-query -W -f='${Status}\t${Package}\t${Version}\n' \
        apt cuda-keyring 'cuda-*' 'libcu*' 'libnvidia-*' nvidia-cuda-toolkit 2>/dev/null |
        while IFS="$TAB" read -r _st _name _ver; do
            case $_st in *" ok installed") printf '%s\t%s\n' "$_name" "$_ver" ;; esac
        done)
}

pkg_version() {   # NAME -> PKGV (empty when not installed)
    PKGV=
    _rest=$PKGS
    while [ -n "$_rest" ]; do
        _line=${_rest%%"$NL"*}
        case $_rest in *"$NL"*) _rest=${_rest#*"$NL"} ;; *) _rest= ;; esac
        if [ "${_line%%"$TAB"*}" = "$1" ]; then PKGV=${_line#*"$TAB"}; return 0; fi
    done
}

probe_apt() {
    read_packages
    _apt=0; have apt-get && _apt=1
    pkg_version apt; _aptv=$PKGV
    if [ -z "$_aptv" ] && [ "$_apt" = 1 ]; then
        _aptv=$(apt-get --version 2>/dev/null); _aptv=${_aptv%%"$NL"*}
        set -f; set -- $_aptv; set +f; _aptv=${2:-}
    fi
    pkg_version cuda-keyring; _kr=$PKGV
    printf '{"present":'; jb "$_apt"
    printf ',"version":'; jn "$_aptv"
    _sqv=0; [ -x "$R/usr/bin/sqv" ] && _sqv=1
    printf ',"sqv":'; jb "$_sqv"
    printf ',"keyring_installed":'; if [ -n "$_kr" ]; then printf true; else printf false; fi
    printf ',"keyring_version":'; jn "$_kr"
    # The keyring's own source list, from dpkg's list of the package's files (what `dpkg-query -L` reads;
    # arch "all", so no ":arch" in its name): apply's facts_check tells it from other NVIDIA entries.
    _kl=
    if [ -n "$_kr" ] && [ -r "$R/var/lib/dpkg/info/cuda-keyring.list" ]; then
        _kl=$(grep -m 1 '^/etc/apt/sources\.list\.d/.*\.list$' "$R/var/lib/dpkg/info/cuda-keyring.list" 2>/dev/null)
    fi
    printf ',"keyring_list":'; jn "$_kl"
    _kf=0; [ -f "$R/usr/share/keyrings/cuda-archive-keyring.gpg" ] && _kf=1
    printf ',"keyring_file":'; jb "$_kf"
    printf ',"nvidia_sources":['
    SEP=
    for _f in "$R/etc/apt/sources.list" "$R"/etc/apt/sources.list.d/*.list "$R"/etc/apt/sources.list.d/*.sources; do
        [ -f "$_f" ] || continue
        grep -Eq 'compute/(cuda|machine-learning)/repos' "$_f" 2>/dev/null || continue
        case $_f in
            *.sources) parse_deb822 "$_f" ;;
            *) parse_list "$_f" ;;
        esac
    done
    printf '],"nvidia_keys":['
    probe_keys
    printf ']'
    # apt >= 2.9 ships no apt-key (Debian 13 has none): advice to run it must know.
    printf ',"apt_key":'; if have apt-key; then printf true; else printf false; fi
    probe_nvidia_index
    printf '}'
}

# What NVIDIA's repository really carries, from apt's own downloaded index of it (no network): the
# cuda-nvcc-X-Y packages in .../lists/*compute_cuda_repos*_Packages, one grep over all of them.
probe_nvidia_index() {
    set --
    for _f in "$R"/var/lib/apt/lists/*compute_cuda_repos*_Packages; do
        [ -f "$_f" ] && set -- "$@" "$_f"
    done
    printf ',"nvidia_index":{"files":%s,"nvcc":[' "$#"
    [ $# -gt 0 ] || { printf ']}'; return 0; }
    _seen=; SEP=
    for _v in $(grep -h '^Package: cuda-nvcc-[0-9]*-[0-9]*$' "$@" 2>/dev/null); do
        case $_v in cuda-nvcc-*) _v=${_v#cuda-nvcc-} ;; *) continue ;; esac
        case " $_seen " in *" $_v "*) continue ;; esac
        _seen="$_seen $_v"
        printf '%s"%s"' "$SEP" "$_v"; SEP=,
    done
    printf ']}'
}

is_nvidia_uri() { case $1 in *compute/cuda/repos* | *compute/machine-learning/repos*) return 0 ;; esac; return 1; }

emit_source() {  # FILE LINE FORMAT TYPES URI SUITE COMPONENTS SIGNED_BY ENABLED
    printf '%s{"file":' "$SEP"; SEP=,
    js "${1#"$R"}"
    printf ',"line":%s,"format":"%s","types":' "$2" "$3"; js "$4"
    printf ',"uri":'; js "$5"
    printf ',"suite":'; js "$6"
    printf ',"components":'; js "$7"
    printf ',"signed_by":'; jn "$8"
    printf ',"enabled":'; jb "$9"
    printf '}'
}

# One-line style: deb [opt=val ...] URI SUITE [COMPONENT...]. Commented lines are not entries.
parse_list() {
    _n=0
    while IFS= read -r _l || [ -n "$_l" ]; do
        _n=$((_n + 1))
        is_nvidia_uri "$_l" || continue
        set -f
        list_entry "$1" "$_n" $_l
        set +f
    done <"$1"
}

list_entry() {
    _file=$1; _line=$2; shift 2
    case ${1:-} in deb | deb-src) _type=$1; shift ;; *) return 0 ;; esac
    _sb=
    case ${1:-} in
        \[*)
            while [ $# -gt 0 ]; do
                _o=${1#\[}; shift
                _last=0
                case $_o in *\]) _last=1; _o=${_o%\]} ;; esac
                case $_o in signed-by=* | Signed-By=*) _sb=${_o#*=} ;; esac
                [ "$_last" = 1 ] && break
            done
            ;;
    esac
    [ $# -ge 1 ] || return 0
    _uri=$1; shift
    _suite=${1:-}; [ $# -ge 1 ] && shift
    emit_source "$_file" "$_line" list "$_type" "$_uri" "$_suite" "$*" "$_sb" 1
}

# deb822 style (.sources): stanzas of "Field: value", blank-line separated; one entry per URI.
parse_deb822() {
    _n=0
    d822_reset
    while IFS= read -r _l || [ -n "$_l" ]; do
        _n=$((_n + 1))
        case $_l in
            '#'*) continue ;;
            [\ \	]*)
                trim "$_l"
                if [ -z "$TRIM" ]; then d822_flush "$1"; continue; fi
                # Folded value: an inline armored key under Signed-By, or more URIs.
                case $_field in
                    signed-by) [ -n "$_sb" ] || _sb=inline ;;
                    uris) _uris="$_uris $TRIM" ;;
                esac
                ;;
            '') d822_flush "$1" ;;
            *:*)
                _k=${_l%%:*}; trim "${_l#*:}"; _v=$TRIM
                _field=
                case $_k in
                    [Tt][Yy][Pp][Ee][Ss]) _types=$_v ;;
                    [Uu][Rr][Ii][Ss]) _uris=$_v; _uline=$_n; _field=uris ;;
                    [Ss][Uu][Ii][Tt][Ee][Ss]) _suites=$_v ;;
                    [Cc][Oo][Mm][Pp][Oo][Nn][Ee][Nn][Tt][Ss]) _comps=$_v ;;
                    [Ss][Ii][Gg][Nn][Ee][Dd]-[Bb][Yy]) _sb=$_v; _field=signed-by ;;
                    [Ee][Nn][Aa][Bb][Ll][Ee][Dd])
                        case $_v in [Nn][Oo] | [Ff][Aa][Ll][Ss][Ee] | 0) _enabled=0 ;; esac ;;
                esac
                ;;
        esac
    done <"$1"
    d822_flush "$1"
}

d822_reset() { _types=; _uris=; _uline=0; _suites=; _comps=; _sb=; _enabled=1; _field=; }

d822_flush() {
    if [ -n "$_uris" ]; then
        set -f
        for _u in $_uris; do
            is_nvidia_uri "$_u" || continue
            emit_source "$1" "$_uline" deb822 "$_types" "$_u" "$_suites" "$_comps" "$_sb" "$_enabled"
        done
        set +f
    fi
    d822_reset
}

# NVIDIA's Debian-family signing keys, found as raw key-ID bytes in binary keyrings (a v4 key's
# issuer and fingerprint subpackets both end in them). No gpg needed, and gpg would write a homedir.
# 7fa2af80: the pre-2022 key (apt-key era); 3bf863cc: the current one (SHA-1 bound, see 1.5 in
# DOMAIN.md). debian13's 8793f200 is known only by its short ID, too short to match bytes safely.
probe_keys() {
    _k7=$(printf '\366\017\113\075\177\242\257\200')
    _k3=$(printf '\244\264\151\226\073\370\143\314')
    SEP=
    set --
    for _f in "$R/etc/apt/trusted.gpg" "$R"/etc/apt/trusted.gpg.d/*.gpg "$R"/etc/apt/keyrings/*.gpg \
        "$R"/usr/share/keyrings/*.gpg; do
        [ -f "$_f" ] && set -- "$@" "$_f"
    done
    [ $# -gt 0 ] || return 0
    # One grep per key over all keyrings (-l: the files that hold it, one per line), not one per file.
    for _pair in "7fa2af80:$_k7" "3bf863cc:$_k3"; do
        _hits=$(grep -lF -- "${_pair#*:}" "$@" 2>/dev/null)
        while [ -n "$_hits" ]; do
            _f=${_hits%%"$NL"*}
            case $_hits in *"$NL"*) _hits=${_hits#*"$NL"} ;; *) _hits= ;; esac
            printf '%s{"key":"%s","file":' "$SEP" "${_pair%%:*}"; SEP=,
            js "${_f#"$R"}"; printf '}'
        done
    done
}

# ---------------------------------------------------------------- dpkg
# lock_id_of ST_DEV INODE -> LOCKID: the file as /proc/locks names it, "MAJ:MIN:INODE" (hex device
# numbers of st_dev, decoded like the kernel's MAJOR/MINOR).
lock_id_of() {
    LOCKID=$(printf '%02x:%02x:%s' $(( ($1 >> 8) & 4095 )) $(( ($1 & 255) | (($1 >> 12) & 1048320) )) "$2")
}

# lock_id PATH -> LOCKID, or ":INODE" when stat(1) is missing.
lock_id() {
    LOCKID=
    _s=$(stat -c '%d %i' "$1" 2>/dev/null) || _s=
    case $_s in
        *[0-9]\ [0-9]*) lock_id_of "${_s% *}" "${_s#* }" ;;
        *)
            _s=$(ls -i "$1" 2>/dev/null)
            trim "$_s"; _s=${TRIM%% *}
            case $_s in '' | *[!0-9]*) ;; *) LOCKID=":$_s" ;; esac ;;
    esac
}

# lock_ids LOCKFILE... -> _ids: "LOCKID LOCKFILE" lines, from one stat(1) call for all of them; without
# stat, or when it fails for any file (one vanished), lock_id file by file.
lock_ids() {
    _ids=
    [ $# -gt 0 ] || return 0
    _n=$#
    for _lf in "$@"; do set -- "$@" "$R$_lf"; done
    shift "$_n"
    _st=
    if have stat; then _st=$(stat -c '%d %i' "$@" 2>/dev/null) || _st=; fi
    for _lf in "$@"; do
        case $_st in
            *[0-9]\ [0-9]*)
                _s=${_st%%"$NL"*}
                case $_st in *"$NL"*) _st=${_st#*"$NL"} ;; *) _st= ;; esac
                lock_id_of "${_s% *}" "${_s#* }" ;;
            *) lock_id "$_lf" ;;
        esac
        [ -n "$LOCKID" ] && _ids="$_ids$LOCKID ${_lf#"$R"}$NL"
    done
}

probe_dpkg() {
    _d=0; have dpkg && _d=1
    # dpkg writes journal files named by number into updates/ and deletes them when a run completes;
    # any left over means a run was interrupted ("dpkg was interrupted, you must manually run ...").
    _pending=0
    for _u in "$R"/var/lib/dpkg/updates/*; do
        case ${_u##*/} in '' | *[!0-9]*) ;; *) _pending=$((_pending + 1)) ;; esac
    done
    printf '{"present":'; jb "$_d"
    printf ',"interrupted":'; if [ "$_pending" -gt 0 ]; then printf true; else printf false; fi
    printf ',"pending_updates":%s' "$_pending"
    printf ',"lock_holders":['
    SEP=
    # /proc/locks names the PID holding each fcntl lock by device and inode: that is "held", not
    # merely "open". The device matters: cloned containers share inode numbers.
    set --
    for _lf in /var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock; do
        [ -e "$R$_lf" ] && set -- "$@" "$_lf"
    done
    lock_ids "$@"
    if [ -n "$_ids" ] && [ -r /proc/locks ]; then
        while read -r _ _a _b _c _pid _devino _rest; do
            [ "$_a" = "->" ] && continue   # a waiter, not a holder
            _rest_ids=$_ids
            while [ -n "$_rest_ids" ]; do
                _entry=${_rest_ids%%"$NL"*}; _rest_ids=${_rest_ids#*"$NL"}
                _id=${_entry%% *}
                case $_id in
                    :*) case $_devino in *"$_id") ;; *) continue ;; esac ;;   # inode only (no stat)
                    *) [ "$_devino" = "$_id" ] || continue ;;
                esac
                _comm=
                [ -r "/proc/$_pid/comm" ] && read -r _comm <"/proc/$_pid/comm"
                printf '%s{"lock":' "$SEP"; SEP=,
                js "${_entry#* }"; printf ',"pid":'; ji "$_pid"; printf ',"command":'; jn "$_comm"; printf '}'
            done
        done </proc/locks
    fi
    printf ']}'
}

# ---------------------------------------------------------------- cuda
# nvcc_version NVCC -> NV_VER ("12.8"), NV_REL ("V12.8.93"), from "release 12.8, V12.8.93".
nvcc_version() {
    NV_VER=; NV_REL=
    _o=$(run_t "$TOOL_TIMEOUT" "$1" --version 2>/dev/null) || true
    case $_o in
        *"release "*)
            _r=${_o#*release }
            NV_VER=${_r%%[!0-9.]*}
            _r=${_r#*, }
            NV_REL=${_r%%[!V0-9.]*}
            ;;
    esac
}

emit_nvcc() {  # PATH(target) -> {"path","version","release"} after nvcc_version
    printf '{"path":'; js "$1"
    printf ',"version":'; jn "$NV_VER"
    printf ',"release":'; jn "$NV_REL"
    printf '}'
}

# resolve_link PATH(target) -> LINK (target path after following symlinks, max 16 hops).
resolve_link() {
    LINK=$1
    _hops=0
    while [ -L "$R$LINK" ] && [ "$_hops" -lt 16 ]; do
        _t=$(readlink "$R$LINK" 2>/dev/null) || break
        case $_t in
            /*) LINK=$_t ;;
            *) LINK=${LINK%/*}/$_t ;;
        esac
        _hops=$((_hops + 1))
    done
}

probe_cuda() {
    printf '{"toolkits":['
    SEP=
    for _d in "$R"/usr/local/cuda-* "$R/usr/local/cuda"; do
        [ -d "$_d" ] && [ ! -L "$_d" ] || continue
        _p=${_d#"$R"}
        NV_VER=; NV_REL=; _nvcc=
        if [ -x "$_d/bin/nvcc" ]; then _nvcc=$_p/bin/nvcc; nvcc_version "$_d/bin/nvcc"; fi
        if [ -z "$NV_VER" ]; then
            case ${_p##*/cuda-} in [0-9]*.[0-9]*) NV_VER=${_p##*/cuda-} ;; esac
        fi
        printf '%s{"path":' "$SEP"; SEP=,
        js "$_p"; printf ',"version":'; jn "$NV_VER"
        printf ',"nvcc":'; jn "$_nvcc"; printf ',"release":'; jn "$NV_REL"; printf '}'
    done
    printf '],"default_link":'
    if [ -L "$R/usr/local/cuda" ]; then resolve_link /usr/local/cuda; js "$LINK"
    elif [ -d "$R/usr/local/cuda" ]; then js /usr/local/cuda
    else printf null; fi

    printf ',"nvcc_on_path":'
    _p=$(PATH=$ORIG_PATH; command -v nvcc 2>/dev/null)
    case $_p in /*) nvcc_version "$_p"; emit_nvcc "$_p" ;; *) printf null ;; esac

    # Debian/Ubuntu's own nvidia-cuda-toolkit puts nvcc in /usr/bin (CUDA_HOME=/usr, old versions).
    printf ',"distro_nvcc":'
    if [ -x "$R/usr/bin/nvcc" ]; then nvcc_version "$R/usr/bin/nvcc"; emit_nvcc /usr/bin/nvcc; else printf null; fi

    printf ',"packages":['
    SEP=
    _rest=$PKGS
    while [ -n "$_rest" ]; do
        _line=${_rest%%"$NL"*}
        case $_rest in *"$NL"*) _rest=${_rest#*"$NL"} ;; *) _rest= ;; esac
        _name=${_line%%"$TAB"*}
        case $_name in
            cuda-* | libcu*-dev-[0-9]* | libcudnn*-dev* | libnvidia-* | nvidia-cuda-toolkit)
                printf '%s{"name":' "$SEP"; SEP=,
                js "$_name"; printf ',"version":'; js "${_line#*"$TAB"}"; printf '}' ;;
        esac
    done
    printf ']'
    probe_env_cuda_home
    printf '}'
}

# CUDA_HOME / CUDA_PATH set for logins (/etc/environment, /etc/profile.d, root's profile files): a build
# started from a shell uses it before anything on PATH. The last literal assignment wins; a value that
# expands something ($VAR) is not resolved, it is reported as it is written.
probe_env_cuda_home() {
    set --
    for _f in "$R/etc/environment" "$R"/etc/profile.d/*.sh "$R/etc/profile" "$R/root/.profile" \
        "$R/root/.bashrc" "$R/root/.bash_profile"; do
        [ -f "$_f" ] && set -- "$@" "$_f"
    done
    _home=; _from=
    if [ $# -gt 0 ]; then
        _hits=$(grep -E '^[[:space:]]*(export[[:space:]]+)?CUDA_(HOME|PATH)=' "$@" 2>/dev/null)
        _last=${_hits##*"$NL"}
        if [ -n "$_last" ]; then
            case $# in 1) _from=${1#"$R"}; _val=$_last ;; *) _from=${_last%%:*}; _from=${_from#"$R"}; _val=${_last#*:} ;; esac
            _val=${_val#*=}; trim "$_val"; unquote "$TRIM"; _home=$UNQ
        fi
    fi
    printf ',"env_cuda_home":'; jn "$_home"
    printf ',"env_cuda_home_file":'; jn "$_from"
    # CUDA_HOME=/usr/local/cuda is usually a symlink (update-alternatives, cuda-toolkit-config-common): a
    # build uses the toolkit it points at, which the toolkit list knows by its real directory.
    printf ',"env_cuda_home_target":'
    case $_home in
        /*) resolve_link "${_home%/}"; js "$LINK" ;;
        *) printf null ;;
    esac
}

# ---------------------------------------------------------------- python envs
# The per-interpreter probe. It never imports torch or an extension in its own process:
# find_spec locates a top-level package without running its __init__, and torch/version.py is read
# as text. With deep=1, imports happen in child processes with timeouts.
PY_PROBE=$(cat <<'PYEOF'
# Only cheap modules at the top: this runs once per interpreter per target, and importlib.metadata,
# ast, glob, subprocess and json (which imports re) would make its start-up several times longer
# (docs/performance.md has the test bed's numbers).
import os, sys

DEEP = sys.argv[1] == "1"
INTERPRETER = sys.argv[2]
# Only where a GPU is visible is it worth reading which archs torch was built for (one grep of ~30 MB).
ARCH_SCAN = len(sys.argv) > 3 and sys.argv[3] == "1"
# How the probe found this interpreter when no one named it ("venv", "conda", "process"); None: named.
DISCOVERED_BY = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] else None
EXTENSIONS = (
    ("causal_conv1d", "causal_conv1d_cuda", ("causal-conv1d", "causal_conv1d")),
    ("fla", None, ("flash-linear-attention", "fla-core")),
    ("flash_attn", "flash_attn_2_cuda", ("flash-attn", "flash_attn")),
    ("mamba_ssm", "selective_scan_cuda", ("mamba-ssm", "mamba_ssm")),
)
CHILD_ENV = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
# -c puts the current directory first on sys.path; a ./torch there is not the environment's torch.
if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]


def to_json(value):
    # json.dumps for the values built here (str, bool, number, None, list, dict), ASCII-only like it.
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        out = []
        for char in value:
            code = ord(char)
            if char in '"\\':
                out.append("\\" + char)
            elif 0x20 <= code < 0x7F:
                out.append(char)
            elif code > 0xFFFF:  # a UTF-16 surrogate pair, as JSON wants
                code -= 0x10000
                out.append("\\u%04x\\u%04x" % (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)))
            else:
                out.append("\\u%04x" % code)
        return '"' + "".join(out) + '"'
    if isinstance(value, dict):
        return "{" + ", ".join(to_json(str(k)) + ": " + to_json(v) for k, v in value.items()) + "}"
    return "[" + ", ".join(to_json(item) for item in value) + "]"


def find(name):
    try:
        import importlib.util
        return importlib.util.find_spec(name)
    except Exception:
        return None


LISTINGS = {}


def listdir(path):
    # Cached: each extension's version lookup walks the same sys.path directories.
    if path not in LISTINGS:
        try:
            LISTINGS[path] = sorted(os.listdir(path))
        except OSError:
            LISTINGS[path] = []
    return LISTINGS[path]


def canonical(name):
    # PEP 503 normalisation, as installers name .dist-info directories (PEP 427: "-" becomes "_").
    out, last = [], ""
    for char in name.lower():
        char = "_" if char in "-_." else char
        if not (char == "_" and last == "_"):
            out.append(char)
        last = char
    return "".join(out)


def metadata_version(path):
    # A .dist-info or .egg-info directory (METADATA / PKG-INFO), or a single-file .egg-info.
    for candidate in (os.path.join(path, "METADATA"), os.path.join(path, "PKG-INFO"), path):
        if not os.path.isfile(candidate):
            continue
        try:
            with open(candidate, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    if not line.strip():
                        break  # the headers end at the first blank line
                    if line.startswith("Version:"):
                        return line[len("Version:"):].strip() or None
        except OSError:
            pass
        return None
    return None


def dist_version(names):
    # What importlib.metadata.version() finds (the first matching distribution along sys.path),
    # without importing it: it pulls in email, zipfile and pathlib, a start-up of its own.
    wanted = set(canonical(name) for name in names)
    for entry in sys.path:
        for item in listdir(entry or "."):
            stem, dot, suffix = item.rpartition(".")
            if not dot or suffix not in ("dist-info", "egg-info"):
                continue
            if canonical(stem.split("-", 1)[0]) in wanted:
                version = metadata_version(os.path.join(entry or ".", item))
                if version is not None:
                    return version
    return None


def literal(text):
    # The values torch's generated version.py assigns: a quoted string, None, True or False.
    text = text.strip()
    if text[:1] in ("'", '"'):
        end = text.find(text[0], 1)
        return text[1:end] if end > 0 else None
    return {"None": None, "True": True, "False": False}.get(text.split("#", 1)[0].strip())


def read_torch_version(spec):
    locations = list(spec.submodule_search_locations or [])
    if not locations:
        return None
    values = {}
    try:
        with open(os.path.join(locations[0], "version.py"), encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except (OSError, ValueError):
        lines = []
    for line in lines:
        # `name = value` or `name: Type = value` (torch/version.py is generated in that shape)
        target, equals, value = line.partition("=")
        name = target.split(":", 1)[0].strip()
        if equals and name.isidentifier() and not line[:1].isspace() and "=" not in value[:1]:
            values[name] = literal(value)
    as_str = lambda v: v if isinstance(v, str) else None
    return {"version": as_str(values.get("__version__")), "cuda": as_str(values.get("cuda")),
            "hip": as_str(values.get("hip")), "path": locations[0],
            "cxx11_abi": read_cxx11_abi(locations[0])}


def read_cxx11_abi(torch_dir):
    # The C++ ABI torch was built with, without importing it: torch >= 2.7 hard-codes the answer in
    # compiled_with_cxx11_abi() ("return True"); older ones ask _C, so the probe cannot say (None).
    try:
        with open(os.path.join(torch_dir, "__init__.py"), encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, ValueError):
        return None
    start = text.find("def compiled_with_cxx11_abi(")
    if start < 0:
        return None
    for line in text[start:].splitlines()[1:12]:
        words = line.split()
        if words[:1] == ["return"]:
            return {"True": True, "False": False}.get(" ".join(words[1:]))
    return None


def python_tag():
    # The wheel tag of this interpreter (cp311): what a wheel built here is tagged with.
    short = {"cpython": "cp", "pypy": "pp"}.get(sys.implementation.name, sys.implementation.name)
    return "%s%d%d" % ((short,) + tuple(sys.version_info[:2]))


def libc():
    # "glibc 2.36": compiled extensions need at least the glibc they were built against.
    try:
        return os.confstr("CS_GNU_LIBC_VERSION") or None
    except (AttributeError, ValueError, OSError):
        return None


def wheel_arch_list(torch_dir):
    # torch.cuda.get_arch_list() without importing torch: it is torch._C._cuda_getArchFlags().split(),
    # a string compiled into lib/libtorch_python.so ("sm_75 sm_80 sm_86 sm_90 sm_100 sm_120" in the
    # 2.14.1 cu130 wheel), so grep finds it; the longest run of sm_/compute_ words is the list.
    import subprocess
    lib = os.path.join(torch_dir, "lib", "libtorch_python.so")
    if not os.path.isfile(lib):
        return None
    pattern = r"(sm|compute)_[0-9]+[af]?( (sm|compute)_[0-9]+[af]?)*"
    try:
        out = subprocess.run(["grep", "-a", "-o", "-E", pattern, lib], stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    runs = out.decode("ascii", "replace").split("\n")
    best = max(runs, key=len) if runs else ""
    return best.split() or None


def run_child(code, timeout):
    import subprocess
    try:
        done = subprocess.run([sys.executable, "-B", "-c", code], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
                              env=CHILD_ENV, cwd="/", universal_newlines=True)
    except subprocess.TimeoutExpired:
        return None, "timed out after %ss" % timeout
    except OSError as exc:
        return None, str(exc)
    if done.returncode != 0:
        lines = [l for l in done.stderr.strip().splitlines() if l.strip()]
        return None, (lines[-1] if lines else "exit %d" % done.returncode)[:500]
    return done.stdout, None


def nvcc_info(path):
    import re, subprocess
    try:
        out = subprocess.run([path, "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, timeout=20, universal_newlines=True).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    found = re.search(r"release (\d+\.\d+), (V[\d.]+)", out)
    return {"path": path, "version": found.group(1) if found else None,
            "release": found.group(2) if found else None}


def pip_toolkit_complete(packages):
    # A buildable toolkit needs more than the nvcc wheel (JAX, say, pulls in nvidia-cuda-nvcc-cu12
    # alone): the runtime headers and CCCL (CUB) too, which cuda-toolkit-pip.yaml installs with it.
    includes = [os.path.join(packages, p, "include") for p in listdir(packages)]
    runtime = any(os.path.isfile(os.path.join(i, "cuda_runtime_api.h")) for i in includes)
    cub = any(os.path.isfile(os.path.join(i, sub, "cub", "cub.cuh")) for i in includes for sub in ("", "cccl"))
    return runtime and cub


def pip_nvccs():
    seen, found = set(), []
    for entry in sys.path:
        packages = os.path.join(entry or ".", "nvidia")
        for package in listdir(packages):
            path = os.path.join(packages, package, "bin", "nvcc")
            real = os.path.realpath(path)
            if os.path.isfile(path) and real not in seen and os.access(path, os.X_OK):
                seen.add(real)
                info = nvcc_info(path)
                info["complete"] = pip_toolkit_complete(packages)
                found.append(info)
    return found


def python_headers():
    # Python.h, which every C/CUDA extension build includes (Debian: python3.X-dev); no sysconfig import.
    base = getattr(sys, "base_prefix", sys.prefix)
    name = "python%d.%d%s" % (sys.version_info[0], sys.version_info[1], getattr(sys, "abiflags", ""))
    return any(os.path.isfile(os.path.join(root, "include", name, "Python.h"))
               for root in dict.fromkeys([sys.prefix, base]))


def externally_managed():
    # PEP 668 (peps.python.org/pep-0668, "Marking an interpreter as using an external package manager"):
    # pip refuses to install into an interpreter whose stdlib directory holds EXTERNALLY-MANAGED
    # (Debian 12: /usr/lib/python3.11/EXTERNALLY-MANAGED), unless it runs in a venv (sys.prefix !=
    # sys.base_prefix). pip 23.0.1's utils/misc.check_externally_managed tests exactly these two.
    if sys.prefix != getattr(sys, "base_prefix", sys.prefix):
        return False
    try:
        import sysconfig
        stdlib = sysconfig.get_path("stdlib")
    except Exception:
        return None
    return bool(stdlib) and os.path.isfile(os.path.join(stdlib, "EXTERNALLY-MANAGED"))


def installer_of(site_dir, name):
    # The INSTALLER file of a distribution's .dist-info (PyPA's "Recording installed projects": the tool
    # that installed it, "pip", "uv", "conda"...); None when there is none (Debian's packages ship none).
    for item in listdir(site_dir):
        stem, dot, suffix = item.rpartition(".")
        if dot and suffix == "dist-info" and canonical(stem.split("-", 1)[0]) == name:
            try:
                with open(os.path.join(site_dir, item, "INSTALLER"), encoding="utf-8", errors="replace") as handle:
                    return handle.readline(64).strip() or None
            except OSError:
                return None
    return None


def pip_config_files():
    # The files pip 23.0.1 reads (its configuration.py and utils/appdirs.py; pip.pypa.io "Configuration"),
    # lowest priority first: global ($XDG_CONFIG_DIRS or /etc/xdg, then /etc), user (~/.pip, then
    # $XDG_CONFIG_HOME or ~/.config; skipped when PIP_CONFIG_FILE names an existing file), site
    # (sys.prefix), then $PIP_CONFIG_FILE. PIP_CONFIG_FILE=/dev/null: no file at all.
    named = os.environ.get("PIP_CONFIG_FILE")
    if named == os.devnull:
        return []
    dirs = (os.environ.get("XDG_CONFIG_DIRS") or "/etc/xdg").split(os.pathsep)
    files = [os.path.join(d, "pip", "pip.conf") for d in dirs] + ["/etc/pip.conf"]
    if not (named and os.path.exists(named)):
        home = os.path.expanduser("~")
        config_home = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
        files += [os.path.join(home, ".pip", "pip.conf"), os.path.join(config_home, "pip", "pip.conf")]
    files.append(os.path.join(sys.prefix, "pip.conf"))
    if named:
        files.append(named)
    return files


def strtobool(value):
    # pip's utils/misc.strtobool, which it applies to a store_true option read from a file or PIP_*.
    value = value.strip().lower()
    return {"y": True, "yes": True, "t": True, "true": True, "on": True, "1": True,
            "n": False, "no": False, "f": False, "false": False, "off": False, "0": False}.get(value)


def pip_config_values(path):
    # The break-system-packages value of [global] and [install] in one file, read the way pip's
    # RawConfigParser reads it (not with configparser: it imports re, which this start-up avoids): a
    # "[section]" header (what is between "[" and the last "]"), "key = value" or "key: value" split at
    # the first delimiter, keys case-insensitive, "_" and "-" alike (pip normalises them), whole-line
    # "#" and ";" comments, an indented line continues the value before it; the last value wins.
    found = {}
    section = key = None
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
    except (OSError, ValueError):
        return found
    for raw in lines:
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if raw[:1].isspace() and key is not None:
            found[section] = (found.get(section) or "") + "\n" + line
            continue
        key = None
        if line.startswith("[") and "]" in line:
            section = line[1:line.rindex("]")]
            continue
        cuts = [at for at in (line.find("="), line.find(":")) if at > 0]
        if cuts and section in ("global", "install"):
            name = line[:min(cuts)].strip().lower().replace("_", "-")
            if name == "break-system-packages":
                key, found[section] = name, line[min(cuts) + 1:].strip()
    return found


def pip_break_system_packages():
    # Where pip is told to ignore PEP 668 for `pip install` (--break-system-packages without the flag):
    # the env var PIP_BREAK_SYSTEM_PACKAGES, or break-system-packages in a config file's [global] or
    # [install] section (later files override earlier; [install] over [global]; the env var over both;
    # an empty value is ignored). The source that decides, when it says true; None when pip would refuse.
    # Read, never run: pip would take seconds to start. The environment is the probe's own, which is the
    # one fleetfix runs pip in.
    found = {"global": None, "install": None}
    for path in pip_config_files():
        if os.path.isfile(path):
            for section, value in pip_config_values(path).items():
                if value.strip():
                    found[section] = (value, path)
    env = os.environ.get("PIP_BREAK_SYSTEM_PACKAGES")
    deciding = (env, "PIP_BREAK_SYSTEM_PACKAGES") if env else (found["install"] or found["global"])
    if deciding and strtobool(deciding[0]):
        return deciding[1]
    return None


def conda_nvcc():
    # conda's cuda-nvcc package puts nvcc in the env's own bin/ (a conda env has conda-meta/).
    path = os.path.join(sys.prefix, "bin", "nvcc")
    if os.path.isdir(os.path.join(sys.prefix, "conda-meta")) and os.access(path, os.X_OK):
        return nvcc_info(path)
    return None


DEEP_TORCH = """
import json, torch
out = {"cuda_available": bool(torch.cuda.is_available()), "device_count": 0, "capabilities": [],
       "arch_list": []}
if out["cuda_available"]:
    out["device_count"] = torch.cuda.device_count()
    out["capabilities"] = ["%d.%d" % torch.cuda.get_device_capability(i) for i in range(out["device_count"])]
    out["arch_list"] = list(torch.cuda.get_arch_list())
print(json.dumps(out))
"""


def deep_torch():
    import json
    out, error = run_child(DEEP_TORCH, 180)
    if error is not None:
        return {"error": error}
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "torch probe printed no result"}


def hub_kernels():
    # transformers 5.0's Mamba-family models load causal-conv1d and mamba-ssm through lazy_load_kernel,
    # which takes them from the Hugging Face Hub (kernels-community/...) whenever the `kernels` package is
    # installed, not from the local build; later releases use the local package first. Which names a
    # release sends to the Hub is its integrations/hub_kernels.py's _HUB_KERNEL_MAPPING, read as text.
    spec = find("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    mapped = []
    try:
        path = os.path.join(list(spec.submodule_search_locations)[0], "integrations", "hub_kernels.py")
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except (OSError, ValueError):
        text = ""
    start = text.find("\n_HUB_KERNEL_MAPPING")   # its definition, at the start of a line
    if start >= 0:
        block = text[start:text.find("\n}", start) + 2]
        for line in block.splitlines()[1:]:
            key = line.strip().split(":", 1)[0].strip()
            if len(key) > 2 and key[0] in "\"'" and key[-1] == key[0]:
                mapped.append(key[1:-1])
    return {"transformers": dist_version(("transformers",)), "kernels": dist_version(("kernels",)),
            "hub_mapped": mapped}


def extension(name, compiled, dists, have_torch):
    spec = find(name)
    result = {"present": spec is not None, "version": dist_version(dists) if spec else None,
              "compiled_module": compiled, "compiled_present": None, "importable": None, "error": None}
    if spec is None:
        return result
    if compiled:
        result["compiled_present"] = find(compiled) is not None
    if DEEP:
        # The compiled module links against libtorch, so torch must be imported first.
        code = ("import torch\n" if have_torch else "") + "".join(
            "import %s\n" % mod for mod in (compiled, name) if mod)
        _, error = run_child(code, 180)
        result["importable"] = error is None
        result["error"] = error
    return result


def main():
    if sys.version_info < (3, 6):
        raise RuntimeError("python %d.%d is too old to inspect (3.6+)" % tuple(sys.version_info[:2]))
    torch_spec = find("torch")
    torch = read_torch_version(torch_spec) if torch_spec else None
    if torch is not None:
        torch["arch_list"] = wheel_arch_list(torch["path"]) if ARCH_SCAN and torch.get("cuda") else None
    env = {
        "interpreter": INTERPRETER, "found": True, "executable": sys.executable,
        "version": "%d.%d.%d" % tuple(sys.version_info[:3]), "prefix": sys.prefix,
        "virtualenv": sys.prefix != getattr(sys, "base_prefix", sys.prefix),
        "python_tag": python_tag(), "libc": libc(),
        "torch": torch, "extensions": {}, "pip_nvcc": pip_nvccs(), "deep": None, "error": None,
        "python_h": python_headers(), "conda_nvcc": conda_nvcc(), "discovered": DISCOVERED_BY,
        "hub_kernels": hub_kernels() if torch is not None else None,
        # What pip does when asked to install here (PEP 668): the build-extensions fix decides on these.
        "externally_managed": externally_managed(), "pip_version": dist_version(("pip",)),
        "pip_break_system_packages": pip_break_system_packages(),
        "torch_installer": installer_of(os.path.dirname(torch["path"]), "torch") if torch else None,
    }
    for name, compiled, dists in EXTENSIONS:
        env["extensions"][name] = extension(name, compiled, dists, torch is not None)
    if DEEP and torch is not None:
        env["deep"] = deep_torch()
    return env


try:
    result = main()
except Exception as exc:
    result = {"interpreter": INTERPRETER, "found": True, "executable": sys.executable,
              "discovered": DISCOVERED_BY, "error": ("%s: %s" % (type(exc).__name__, exc))[:500]}
sys.stdout.write("\n" + to_json(result) + "\n")
PYEOF
)

# probe_python INTERPRETER [SOURCE]: SOURCE is how discovery found it (venv, conda, process), when it did.
probe_python() {
    _py=$1; _found_by=${2:-}
    case $_py in
        */*) if [ -x "$_py" ] && [ ! -d "$_py" ]; then _path=$_py; else _path=; fi ;;
        *)
            _path=$(command -v "$_py" 2>/dev/null)
            case $_path in /*) ;; *) _path= ;; esac ;;   # a builtin or alias is not an interpreter
    esac
    if [ -z "$_path" ]; then
        printf '{"interpreter":'; js "$_py"; printf ',"discovered":'; jn "$_found_by"
        printf ',"found":false,"error":"interpreter not found"}'
        return 0
    fi
    _limit=120; [ "$DEEP" = 1 ] && _limit=900
    _scan=0
    for _d in "$R"/dev/nvidia[0-9]*; do [ -e "$_d" ] && _scan=1; done
    _out=$(run_t "$_limit" "$_path" -B -c "$PY_PROBE" "$DEEP" "$_py" "$_scan" "$_found_by" 2>/dev/null)
    _rc=$?
    _out=${_out##*"$NL"}   # the result is the last line; anything a .pth file printed comes before
    case $_out in
        \{*\}) printf '%s' "$_out" ;;
        *)
            printf '{"interpreter":'; js "$_py"
            printf ',"found":true,"executable":'; js "$_path"
            printf ',"discovered":'; jn "$_found_by"
            printf ',"error":'; js "interpreter ran but printed no probe result (exit $_rc; python 3 required)"
            printf '}' ;;
    esac
}

# ---------------------------------------------------------------- interpreter discovery
# Where torch often lives besides the interpreters named: venvs under /opt and in home directories, conda
# envs, and the interpreters of running python processes. Finding them is cheap: globs, torch's version.py
# read as text, one ls(1) for all of /proc, at most DISCOVER_MAX candidates. Each candidate whose env has
# torch is then inspected like a named interpreter (inspect_discovered), so its whole chain is judged.
# An inventory that pins `pythons` turns all of this off (FLEETFIX_DISCOVER=0): its list is the whole list.
DISCOVER_MAX=16
# discover_pythons -> DISCOVERED: one "PATH<TAB>SOURCE<TAB>PREFIX<TAB>VERSION<TAB>CUDA<TAB>TORCHDIR" line per
# candidate (the torch fields empty when its env has none).
discover_pythons() {
    _seen=; _count=0
    for _py in "$R"/opt/*/bin/python3 "$R"/opt/*/venv/bin/python3 "$R"/opt/*/.venv/bin/python3 \
        "$R"/root/.venv/bin/python3 "$R"/home/*/.venv/bin/python3 "$R"/root/venv/bin/python3 \
        "$R"/opt/conda/envs/*/bin/python3 "$R"/opt/*conda*/envs/*/bin/python3 "$R"/root/*conda*/bin/python3 \
        "$R"/root/*conda*/envs/*/bin/python3 "$R"/home/*/*conda*/envs/*/bin/python3; do
        [ -x "$_py" ] || continue
        _py=${_py#"$R"}
        case $_py in */envs/*) discovered "$_py" conda ;; *conda*) discovered "$_py" conda ;; *) discovered "$_py" venv ;; esac
    done
    # Running python processes: their interpreter, found through /proc/PID/exe (this container's only).
    _procs=$(ls -l /proc/[0-9]*/exe 2>/dev/null | head -n 512)
    while [ -n "$_procs" ]; do
        _line=${_procs%%"$NL"*}
        case $_procs in *"$NL"*) _procs=${_procs#*"$NL"} ;; *) _procs= ;; esac
        _exe=${_line##*-> }
        case ${_exe##*/} in python | python3 | python3.[0-9]*) discovered "$_exe" process ;; esac
    done
}

# discovered PATH SOURCE: one candidate, once, with torch's version and CUDA when its env has torch.
discovered() {
    [ "$_count" -lt "$DISCOVER_MAX" ] || return 0
    case " $_seen " in *" $1 "*) return 0 ;; esac
    case $1 in *"$TAB"* | *"$NL"* | *" "*) return 0 ;; esac   # a path the line format cannot hold
    _seen="$_seen $1"; _count=$((_count + 1))
    _prefix=${1%/bin/*}
    _tv=; _tc=; _tpath=
    for _vf in "$R$_prefix"/lib/python3*/site-packages/torch/version.py; do
        [ -f "$_vf" ] || continue
        _tpath=${_vf%/version.py}; _tpath=${_tpath#"$R"}
        while IFS= read -r _l || [ -n "$_l" ]; do
            case $_l in
                __version__*=*) _v=${_l#*=}; trim "$_v"; unquote "$TRIM"; _tv=$UNQ ;;
                cuda*=*) case $_l in cuda[\ :=]*) _v=${_l#*=}; trim "$_v"; unquote "$TRIM"; _tc=$UNQ ;; esac ;;
            esac
        done <"$_vf"
        break
    done
    [ "$_tc" = None ] && _tc=
    # Empty fields are written as "-": read(1) with a TAB in IFS merges adjacent TABs (it is whitespace).
    DISCOVERED="$DISCOVERED$1$TAB$2$TAB$_prefix$TAB${_tv:--}$TAB${_tc:--}$TAB${_tpath:--}$NL"
}

# split_discovered LINE -> D_PATH D_SOURCE D_PREFIX D_VERSION D_CUDA D_TORCH (a "-" read back as empty).
split_discovered() {
    _oldifs=$IFS; IFS=$TAB
    set -f; set -- $1; set +f
    IFS=$_oldifs
    D_PATH=$1; D_SOURCE=$2; D_PREFIX=$3; D_VERSION=$4; D_CUDA=$5; D_TORCH=$6
    [ "$D_VERSION" = - ] && D_VERSION=
    [ "$D_CUDA" = - ] && D_CUDA=
    [ "$D_TORCH" = - ] && D_TORCH=
    return 0
}

# named_prefixes NAMED... -> NAMED_PREFIXES: " PREFIX " of each named interpreter that exists (its path less
# /bin/NAME), so that an env already inspected under another name is not inspected twice.
named_prefixes() {
    NAMED_PREFIXES=" "
    for _n in "$@"; do
        case $_n in */*) _p=$_n ;; *) _p=$(command -v "$_n" 2>/dev/null) ;; esac
        case $_p in /*/bin/*) NAMED_PREFIXES="$NAMED_PREFIXES${_p%/bin/*} " ;; esac
    done
}

# inspect_discovered NAMED...: inside the "pythons" array, every discovered env with torch that no named
# interpreter covers, inspected in full (probe_python) and tagged with how it was found.
inspect_discovered() {
    INSPECTED=" "; GIVEN=" $* "; NAMED_PREFIXES=
    [ -n "$DISCOVERED" ] || return 0
    named_prefixes "$@"
    _rest=$DISCOVERED
    while [ -n "$_rest" ]; do
        _line=${_rest%%"$NL"*}; _rest=${_rest#*"$NL"}
        split_discovered "$_line"
        [ -n "$D_TORCH" ] || continue
        case "$GIVEN$NAMED_PREFIXES$INSPECTED" in *" $D_PATH "* | *" $D_PREFIX "*) continue ;; esac
        INSPECTED="$INSPECTED$D_PREFIX "
        printf '%s' "$SEP"; SEP=,
        probe_python "$D_PATH" "$D_SOURCE"
    done
}

# emit_discovered: the "discovered_pythons" fact, each candidate marked inspected when a named interpreter
# is that very path or lives in that prefix, or inspect_discovered inspected it.
emit_discovered() {
    printf ',"discovered_pythons":['
    _sep=; _rest=$DISCOVERED
    while [ -n "$_rest" ]; do
        _line=${_rest%%"$NL"*}; _rest=${_rest#*"$NL"}
        split_discovered "$_line"
        printf '%s{"path":' "$_sep"; _sep=,; js "$D_PATH"
        printf ',"source":"%s","prefix":' "$D_SOURCE"; js "$D_PREFIX"
        case "$GIVEN${NAMED_PREFIXES:-}$INSPECTED" in
            *" $D_PATH "* | *" $D_PREFIX "*) printf ',"inspected":true' ;;
            *) printf ',"inspected":false' ;;
        esac
        printf ',"torch":'
        if [ -n "$D_TORCH" ]; then
            printf '{"version":'; jn "$D_VERSION"; printf ',"cuda":'; jn "$D_CUDA"; printf ',"path":'; js "$D_TORCH"; printf '}'
        else
            printf null
        fi
        printf '}'
    done
    printf ']'
}

# ---------------------------------------------------------------- gpu
probe_gpu() {
    printf '{"devices":['
    SEP=
    for _d in "$R"/dev/nvidia*; do
        [ -e "$_d" ] && [ ! -d "$_d" ] || continue
        printf '%s' "$SEP"; SEP=,; js "${_d#"$R"}"
    done
    printf ']'
    _smi=$(command -v nvidia-smi 2>/dev/null)
    _drv=; _names=; _caps=; _err=
    if [ -n "$_smi" ]; then
        _o=$(run_t "$TOOL_TIMEOUT" "$_smi" --query-gpu=driver_version,name,compute_cap --format=csv,noheader 2>/dev/null)
        _rc=$?
        # compute_cap arrived in driver 510; older ones reject the field. A timeout (124) is not
        # retried: a wedged GPU would only make us wait twice.
        if [ $_rc -ne 0 ] && [ $_rc -ne 124 ]; then
            _o2=$(run_t "$TOOL_TIMEOUT" "$_smi" --query-gpu=driver_version,name --format=csv,noheader 2>/dev/null) && { _o=$_o2; _rc=0; }
        fi
        if [ $_rc -eq 0 ]; then
            _ns=; _cs=
            _rest=$_o
            while [ -n "$_rest" ]; do
                _line=${_rest%%"$NL"*}
                case $_rest in *"$NL"*) _rest=${_rest#*"$NL"} ;; *) _rest= ;; esac
                trim "$_line"; _line=$TRIM
                [ -n "$_line" ] || continue
                _drv=${_line%%,*}
                _tail=${_line#*, }
                case $_tail in
                    *,*) _cap=${_tail##*, }; _name=${_tail%, *} ;;
                    *) _cap=; _name=$_tail ;;
                esac
                _names="$_names$_ns$(js "$_name")"; _ns=,
                [ -n "$_cap" ] && { _caps="$_caps$_cs$(js "$_cap")"; _cs=,; }
            done
        else
            # NVML failures ("Failed to initialize NVML: Driver/library version mismatch") go to stdout.
            trim "$_o"; _err=${TRIM%%"$NL"*}
            [ -n "$_err" ] || _err="nvidia-smi exited $_rc"
            [ $_rc -eq 124 ] && _err="nvidia-smi timed out after ${TOOL_TIMEOUT}s"
        fi
    fi
    printf ',"smi_present":'; if [ -n "$_smi" ]; then printf true; else printf false; fi
    printf ',"smi_error":'; jn "$_err"
    printf ',"driver_version":'; jn "$_drv"
    printf ',"names":[%s],"compute_caps":[%s]' "$_names" "$_caps"
    # Container userspace driver version = the numeric suffix of libcuda.so.X.Y / libnvidia-ml.so.X.Y.
    printf ',"driver_libs":['
    SEP=
    for _dir in /usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /usr/lib64 /usr/lib /usr/local/nvidia/lib64; do
        [ -d "$R$_dir" ] && [ ! -L "$R$_dir" ] || continue
        for _f in "$R$_dir"/libcuda.so.*.* "$R$_dir"/libnvidia-ml.so.*.*; do
            [ -e "$_f" ] || continue
            _v=${_f##*.so.}
            case $_v in [0-9]*.[0-9]*) ;; *) continue ;; esac
            case $_v in *[!0-9.]*) continue ;; esac
            printf '%s{"file":' "$SEP"; SEP=,; js "${_f#"$R"}"
            printf ',"version":'; js "$_v"; printf '}'
        done
    done
    printf ']}'
}

# ---------------------------------------------------------------- build readiness
tool_version() {  # CMD ARGS... -> first line of its output, or empty
    _o=$(run_t 10 "$@" 2>/dev/null) || _o=
    printf '%s' "${_o%%"$NL"*}"
}

# disk_free_json PATH... -> {"PATH":MiB,...}: free space of the filesystem holding each PATH (its nearest
# existing parent), from one df(1) call; null for all of them if df fails.
disk_free_json() {
    _names=
    _n=$#
    for _p in "$@"; do
        _names="$_names$_p$NL"
        while [ ! -e "$R$_p" ] && [ "$_p" != / ]; do _p=${_p%/*}; [ -n "$_p" ] || _p=/; done
        set -- "$@" "$R$_p"
    done
    shift "$_n"
    _o=$(df -Pk "$@" 2>/dev/null) && _o=${_o#*"$NL"} || _o=   # without the header line
    printf '{'; _sep=
    while [ -n "$_names" ]; do
        _name=${_names%%"$NL"*}; _names=${_names#*"$NL"}
        _line=${_o%%"$NL"*}
        case $_o in *"$NL"*) _o=${_o#*"$NL"} ;; *) _o= ;; esac
        printf '%s' "$_sep"; js "$_name"; printf ':'; _sep=,
        set -f; set -- $_line; set +f
        case ${4:-} in '' | *[!0-9]*) printf null ;; *) printf '%s' $(( $4 / 1024 )) ;; esac
    done
    printf '}'
}

probe_build() {
    printf '{"gcc":'; if have gcc; then printf true; else printf false; fi
    printf ',"gcc_version":'; if have gcc; then jn "$(tool_version gcc -dumpfullversion -dumpversion)"; else printf null; fi
    printf ',"gxx":'; if have g++; then printf true; else printf false; fi
    printf ',"gxx_version":'; if have g++; then jn "$(tool_version g++ -dumpfullversion -dumpversion)"; else printf null; fi
    printf ',"ninja":'; if have ninja; then printf true; else printf false; fi
    printf ',"ninja_version":'; if have ninja; then jn "$(tool_version ninja --version)"; else printf null; fi
    printf ',"make":'; if have make; then printf true; else printf false; fi
    # The versioned compilers installed beside the default (Debian's g++-N): a host compiler nvcc
    # accepts may already be there. A glob, no fork.
    printf ',"gxx_majors":['; _sep=
    for _g in "$R"/usr/bin/g++-[0-9] "$R"/usr/bin/g++-[0-9][0-9]; do
        [ -x "$_g" ] || continue
        printf '%s%s' "$_sep" "${_g#"$R"/usr/bin/g++-}"; _sep=,
    done
    printf ']'
    # The C library's version: nvcc's headers must compile against its <math.h> (glibc >= 2.41 breaks
    # nvcc <= 12.9). getconf prints "glibc 2.41"; ldd's first line ends with the version.
    _glibc=$(tool_version getconf GNU_LIBC_VERSION)
    case $_glibc in
        "glibc "[0-9]*) _glibc=${_glibc#glibc } ;;
        *) _glibc=$(tool_version ldd --version); _glibc=${_glibc##* } ;;
    esac
    case $_glibc in [0-9]*.[0-9]*) ;; *) _glibc= ;; esac
    printf ',"glibc":'; jn "$_glibc"
    printf ',"disk_free_mb":'; disk_free_json / /var/cache/apt /usr/local
    _mt=; _ma=
    if [ -r /proc/meminfo ]; then
        while read -r _k _v _; do
            case $_k in MemTotal:) _mt=$_v ;; MemAvailable:) _ma=$_v ;; esac
        done </proc/meminfo
    fi
    printf ',"mem_total_mb":'; case $_mt in '' | *[!0-9]*) printf null ;; *) printf '%s' $((_mt / 1024)) ;; esac
    printf ',"mem_available_mb":'; case $_ma in '' | *[!0-9]*) printf null ;; *) printf '%s' $((_ma / 1024)) ;; esac
    _cpus=$(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null)
    printf ',"cpus":'; ji "$_cpus"
    # pip builds in $TMPDIR (/tmp): on a tmpfs that is RAM, and an extension's build tree is ~1 GB.
    _tmpfs=
    if [ -r /proc/mounts ]; then
        while read -r _ _mp _fs _; do [ "$_mp" = /tmp ] && _tmpfs=$_fs; done </proc/mounts
    fi
    printf ',"tmp_fstype":'; jn "$_tmpfs"
    printf ',"tmp_free_mb":'
    if [ "$_tmpfs" = tmpfs ]; then disk_free_json /tmp; else printf null; fi
    printf '}'
}

main "$@" </dev/null
exit 0
