# SPDX-License-Identifier: BSD-3-Clause
# Sourced by gnh's install scripts. gnh_apt_install PACKAGE... installs, from
# Debian's archive, those of the packages that are not installed yet (one
# apt-get update first) and does nothing when all are. A package named
# NAME:ARCH of a foreign architecture enables that architecture first.
gnh_apt_install() {
  local missing=() p arch
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "gnh: installing ${missing[*]}"
  local sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  for p in "${missing[@]}"; do
    arch="${p##*:}"
    if [ "$arch" != "$p" ] && [ "$arch" != "$(dpkg --print-architecture)" ] &&
      ! dpkg --print-foreign-architectures | grep -qx "$arch"; then
      "${sudo_cmd[@]}" dpkg --add-architecture "$arch"
    fi
  done
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}
