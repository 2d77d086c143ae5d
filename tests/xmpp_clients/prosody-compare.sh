#!/bin/sh
# The fan-out parts of client.mjs run once against Debian's prosody (a real pubsub server),
# to check the scripts before trusting them against this broker. Not part of the test suite:
# `sh tests/xmpp_clients/prosody-compare.sh` prints each client's JSON lines.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d /tmp/prosody-compare.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
c2s=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$dir/prosody.cfg.lua" <<CFG
run_as_root = true
admins = { "bob@localhost" }
daemonize = false
pidfile = "$dir/prosody.pid"
data_path = "$dir/data"
log = { info = "$dir/prosody.log" }
modules_enabled = { "saslauth", "disco", "ping", "websocket", "offline", "roster", "posix" }
modules_disabled = { "s2s" }
c2s_ports = { $c2s }
c2s_interfaces = { "127.0.0.1" }
http_ports = { $port }
http_interfaces = { "127.0.0.1" }
https_ports = {}
s2s_ports = {}
consider_websocket_secure = true
allow_unencrypted_plain_auth = true
c2s_require_encryption = false
authentication = "internal_hashed"
VirtualHost "localhost"
Component "pubsub.localhost" "pubsub"
CFG
mkdir -p "$dir/data"
for u in bob jtegen alice; do prosodyctl --config "$dir/prosody.cfg.lua" register $u localhost pw; done
prosody --config "$dir/prosody.cfg.lua" > "$dir/stdout.log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null || true' EXIT
sleep 2
url="ws://127.0.0.1:$port/xmpp-websocket"
run() { timeout "$1" node --experimental-websocket --no-warnings "$here/client.mjs" "$2" || true; }
node="/x/compare"
echo "## @xmpp/client (an admin: prosody lets only admins create nodes) creates the node"
run 15 "{\"lib\":\"xmpp\",\"mode\":\"publisher\",\"create\":true,\"count\":0,\"url\":\"$url\",\"user\":\"bob\",\"password\":\"pw\",\"resource\":\"p0\",\"node\":\"$node\"}"
echo "## stanza subscribes (SCRAM), then goes offline"
run 10 "{\"lib\":\"stanza\",\"mode\":\"subscriber\",\"url\":\"$url\",\"user\":\"jtegen\",\"password\":\"pw\",\"resource\":\"s1\",\"node\":\"$node\",\"service\":\"pubsub.localhost\"}"
echo "## @xmpp/client publishes 3 items"
run 15 "{\"lib\":\"xmpp\",\"mode\":\"publisher\",\"count\":3,\"ids\":true,\"prefix\":\"b\",\"url\":\"$url\",\"user\":\"bob\",\"password\":\"pw\",\"resource\":\"p1\",\"node\":\"$node\"}"
echo "## stanza subscribes again, then @xmpp/client publishes 2 more while it is online"
(run 12 "{\"lib\":\"stanza\",\"mode\":\"subscriber\",\"url\":\"$url\",\"user\":\"jtegen\",\"password\":\"pw\",\"resource\":\"s2\",\"node\":\"$node\"}") &
bg=$!
sleep 4
run 10 "{\"lib\":\"xmpp\",\"mode\":\"publisher\",\"count\":2,\"ids\":true,\"prefix\":\"live\",\"url\":\"$url\",\"user\":\"bob\",\"password\":\"pw\",\"resource\":\"p2\",\"node\":\"$node\"}"
wait $bg
echo "## stanza comes back without presence (backlog on bind?)"
run 8 "{\"lib\":\"stanza\",\"mode\":\"listen\",\"url\":\"$url\",\"user\":\"jtegen\",\"password\":\"pw\",\"resource\":\"s3\",\"node\":\"$node\"}"
echo "## and with initial presence"
run 8 "{\"lib\":\"stanza\",\"mode\":\"listen\",\"presence\":true,\"url\":\"$url\",\"user\":\"jtegen\",\"password\":\"pw\",\"resource\":\"s4\",\"node\":\"$node\"}"
echo "## @xmpp/client subscribes with initial presence and listens (payloads)"
(run 10 "{\"lib\":\"xmpp\",\"mode\":\"subscriber\",\"presence\":true,\"url\":\"$url\",\"user\":\"alice\",\"password\":\"pw\",\"resource\":\"l1\",\"node\":\"$node\"}") &
bg=$!
sleep 4
run 10 "{\"lib\":\"xmpp\",\"mode\":\"publisher\",\"count\":1,\"ids\":true,\"prefix\":\"pl\",\"url\":\"$url\",\"user\":\"bob\",\"password\":\"pw\",\"resource\":\"p3\",\"node\":\"$node\"}"
wait $bg
echo "## stanza with initial presence, online while @xmpp/client publishes"
(run 12 "{\"lib\":\"stanza\",\"mode\":\"listen\",\"presence\":true,\"url\":\"$url\",\"user\":\"jtegen\",\"password\":\"pw\",\"resource\":\"s5\",\"node\":\"$node\"}") &
bg=$!
sleep 4
run 10 "{\"lib\":\"xmpp\",\"mode\":\"publisher\",\"count\":1,\"ids\":true,\"prefix\":\"st\",\"url\":\"$url\",\"user\":\"bob\",\"password\":\"pw\",\"resource\":\"p4\",\"node\":\"$node\"}"
wait $bg
echo "## prosody log: $dir/prosody.log"
