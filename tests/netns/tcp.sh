#!/usr/bin/env bash
# Beyond one host (issue 15): two network namespaces of this machine joined by
# a veth pair stand in for two hosts. A 2-rank pipeline launched across them
# (mpirun in one, the other's daemon started by tests/netns/ns-agent instead
# of ssh; --mca btl self,tcp restricted to the veth's subnet) writes output
# byte-identical, digests included, to one rank; the agent's log shows the
# launch into the second namespace and the veth carried at least the bytes
# the head reports sending.
source "$(dirname "$0")/../e2e/lib.bash"
source "$(dirname "$0")/lib.bash"
netns_need_root "$@"
NS_DIR="$E2E_TMP"
trap 'netns_down; rm -rf "$E2E_TMP"' EXIT
chmod 755 "$E2E_TMP"
netns_up
echo "# hosts: $NS_A $ADDR_A, $NS_B $ADDR_B"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 16 --embed-rows 12 --prompt-tokens 3 --max-new 40 --mixed --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/one.jsonl" --digest --batch 4 2>/dev/null

tx0=$(veth_tx_bytes)
rc=0
PD_NETNS_LOG="$T/agent.log" timeout 120 "${MPIRUN_TCP[@]}" "$PD_BUILD/pipedec" run --model "$m" --pages "$P" \
  --out "$T/tcp.jsonl" --digest --batch 4 --stats "$T/tcp.stats" >"$T/tcp.log" 2>&1 || rc=$?
tx1=$(veth_tx_bytes)
if [ "$rc" -eq 0 ]; then pass "2 ranks across two namespaces over TCP: exit 0"; else fail "mpirun exit $rc"; tail -20 "$T/tcp.log"; fi
same "$T/one.jsonl" "$T/tcp.jsonl" "2 ranks on two hosts over TCP == 1 rank"
grep -q "^$ADDR_B $NS_B " "$T/agent.log" 2>/dev/null && pass "the agent started the second host's daemon in $NS_B" \
  || { fail "the agent did not launch into $NS_B"; cat "$T/agent.log" 2>/dev/null; }
sent=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['stages'][0]['bytes_sent'])" "$T/tcp.stats" 2>/dev/null || echo 0)
if [ "$sent" -gt 0 ] && [ $((tx1 - tx0)) -ge "$sent" ]; then
  pass "the veth carried $((tx1 - tx0)) bytes, the head sent $sent bytes of messages"
else
  fail "veth carried $((tx1 - tx0)) bytes, head sent $sent"
fi
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/other.jsonl" --digest --batch 4 --sample temp:0.9 --seed 5 2>/dev/null
differ "$T/one.jsonl" "$T/other.jsonl" "negative control: seeded sampling"
finish
