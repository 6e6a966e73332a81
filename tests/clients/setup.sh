#!/usr/bin/env bash
# Installs the pinned stock SDK clients that tests/sdk_clients.rs drives against a mount:
# @anthropic-ai/sdk 1.14.0 into tests/clients/node_modules (npm ci from the committed lockfile)
# and anthropic 2.14.0 into the venv tests/clients/.venv (exact pins in requirements.txt), so
# the system Python is untouched; and the moto S3 server that tests/replica.rs replicates to,
# into the venv tests/replica/.venv (exact pins in tests/replica/requirements.txt).
# Idempotent; safe to run as root on a fresh machine.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

need() { command -v "$1" >/dev/null 2>&1 || { echo "setup.sh: $1 is required ($2)" >&2; exit 1; }; }
need node "Node.js 20"
need npm "comes with Node.js"
need python3 "Python 3.10 or later (anthropic 2.14.0 needs it); tested on 3.11"

node_major=$(node -p 'process.versions.node.split(".")[0]')
if [ "$node_major" -lt 18 ]; then
  echo "setup.sh: Node $(node --version) is too old for @anthropic-ai/sdk 1.14.0 (tested here on Node 20)" >&2
  exit 1
elif [ "$node_major" -lt 20 ]; then
  echo "setup.sh: warning: Node $(node --version); these tests are known to pass on Node 20" >&2
fi

# npm ci installs exactly the lockfile (and removes a stale node_modules first).
npm ci --no-audit --no-fund --loglevel=error

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys' >/dev/null 2>&1; then
  rm -rf .venv
  if ! python3 -m venv .venv; then
    echo "setup.sh: python3 -m venv failed; on Debian/Ubuntu install python3-venv (apt-get install -y python3-venv)" >&2
    exit 1
  fi
fi
.venv/bin/python -m pip install --disable-pip-version-check --quiet -r requirements.txt

# The S3-protocol server of the replication tests.
if [ ! -x ../replica/.venv/bin/python ] || ! ../replica/.venv/bin/python -c 'import sys' >/dev/null 2>&1; then
  rm -rf ../replica/.venv
  python3 -m venv ../replica/.venv
fi
../replica/.venv/bin/python -m pip install --disable-pip-version-check --quiet -r ../replica/requirements.txt

# Fail here, not in the tests, if the pins did not take.
node -e '
  const v = require("@anthropic-ai/sdk/version").VERSION;
  if (v !== "1.14.0") { console.error(`@anthropic-ai/sdk is ${v}, want 1.14.0`); process.exit(1); }
  console.log(`@anthropic-ai/sdk ${v} (node ${process.version})`);
'
.venv/bin/python -c '
import sys, anthropic
from anthropic.tools import BetaLocalFilesystemMemoryTool  # noqa: F401
if anthropic.__version__ != "2.14.0":
    sys.exit(f"anthropic is {anthropic.__version__}, want 2.14.0")
print(f"anthropic {anthropic.__version__} (python {sys.version.split()[0]})")
'
../replica/.venv/bin/python -c '
import sys, moto
if moto.__version__ != "5.2.5":
    sys.exit(f"moto is {moto.__version__}, want 5.2.5")
print(f"moto {moto.__version__} (S3 server for the replication tests)")
'
