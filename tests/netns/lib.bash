# Two test "hosts" on this machine (sourced, not run): network namespaces
# joined by a veth pair, with addresses this script picks in 10.231.0.0/16
# (a /24 not already on this machine), an address -> namespace map for the
# launch agent tests/netns/ns-agent, and an Open MPI hostfile. Everything is
# removed when the sourcing script exits. Needs root (or passwordless sudo);
# without it the caller fails loudly.
#
# After netns_up:
#   NS_A, NS_B          namespace names; ADDR_A, ADDR_B their addresses
#   NS_HOSTFILE         "ADDR_A slots=1" / "ADDR_B slots=1"
#   MPIRUN_TCP=(...)    mpirun, started inside NS_A, placing one rank per host
#                       (--map-by node), launching NS_B's daemon through the agent,
#                       ranks talking over TCP on the veth only
#   in_a CMD...         runs CMD inside NS_A
# Needs NS_DIR (a directory of the caller's, for the map and the hostfile).
NS_SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

netns_need_root() {
  if [ "$(id -u)" -ne 0 ]; then
    if sudo -n true 2>/dev/null; then exec sudo -n --preserve-env bash "$0" "$@"; fi
    echo "FAIL - $0 needs root (or passwordless sudo) to create network namespaces" >&2
    exit 1
  fi
}

NS_A="" NS_B=""
netns_down() {
  [ -n "$NS_A" ] && ip netns del "$NS_A" 2>/dev/null || true
  [ -n "$NS_B" ] && ip netns del "$NS_B" 2>/dev/null || true
}

netns_up() {
  : "${NS_DIR:?NS_DIR must name a directory}"
  local tag=$$ sub
  # a /24 that no interface of this machine uses yet
  for i in $(seq 0 249); do
    sub=$(( (tag + i) % 250 ))
    ip -4 -o addr show | grep -q " 10\.231\.$sub\." || break
  done
  ADDR_A="10.231.$sub.1" ADDR_B="10.231.$sub.2" NS_NET="10.231.$sub.0/24"
  NS_A="pd-a-$tag" NS_B="pd-b-$tag"
  ip netns add "$NS_A"
  ip netns add "$NS_B"
  ip link add "pdva$tag" type veth peer name "pdvb$tag"
  ip link set "pdva$tag" netns "$NS_A"
  ip link set "pdvb$tag" netns "$NS_B"
  ip -n "$NS_A" addr add "$ADDR_A/24" dev "pdva$tag"
  ip -n "$NS_B" addr add "$ADDR_B/24" dev "pdvb$tag"
  for n in "$NS_A" "$NS_B"; do ip -n "$n" link set lo up; done
  ip -n "$NS_A" link set "pdva$tag" up
  ip -n "$NS_B" link set "pdvb$tag" up
  NS_VETH_A="pdva$tag"
  printf '%s %s\n%s %s\n' "$ADDR_A" "$NS_A" "$ADDR_B" "$NS_B" > "$NS_DIR/hosts"
  printf '%s slots=1\n%s slots=1\n' "$ADDR_A" "$ADDR_B" > "$NS_DIR/hostfile"
  export PD_NETNS_HOSTS="$NS_DIR/hosts"
  NS_HOSTFILE="$NS_DIR/hostfile"
  MPIRUN_TCP=(ip netns exec "$NS_A" mpirun --allow-run-as-root -np 2 --hostfile "$NS_HOSTFILE" --map-by node
              --bind-to none --mca plm rsh --mca plm_rsh_agent "$NS_SRC/ns-agent" --mca plm_rsh_no_tree_spawn 1
              --mca pml ob1 --mca btl self,tcp --mca btl_tcp_if_include "$NS_NET" --mca oob_tcp_if_include "$NS_NET")
}

in_a() { ip netns exec "$NS_A" "$@"; }

# veth_tx_bytes: bytes NS_A's end of the veth has sent
veth_tx_bytes() { cat "/sys/class/net/$NS_VETH_A/statistics/tx_bytes" 2>/dev/null || in_a cat "/sys/class/net/$NS_VETH_A/statistics/tx_bytes"; }
