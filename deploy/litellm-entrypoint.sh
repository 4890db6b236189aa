#!/bin/sh
# Entrypoint of the `gateway` service (LiteLLM proxy): turn the Docker secrets into the
# environment variables that deploy/litellm.yaml reads (os.environ/NAME), then exec the
# proxy, so it is PID 1's only child and gets SIGTERM from `docker stop` directly.
#
# A secret file wins over a variable of the same name, so a key never has to sit in the
# container's environment (`docker inspect` shows that; it does not show secret files).
# SECRETS_DIR is for trying this script outside a container.
set -eu

secrets_dir="${SECRETS_DIR:-/run/secrets}"
for name in UPSTREAM_API_KEY LITELLM_MASTER_KEY; do
    file="$secrets_dir/$(printf '%s' "$name" | tr '[:upper:]' '[:lower:]')"
    if [ -s "$file" ]; then
        value="$(cat "$file")"
        export "$name=$value"
    fi
done

for name in UPSTREAM_BASE_URL UPSTREAM_MODEL UPSTREAM_API_KEY LITELLM_MASTER_KEY; do
    eval "value=\${$name:-}"
    if [ -z "$value" ]; then
        echo "litellm-entrypoint: $name is not set (see .env.example)" >&2
        exit 2
    fi
done

# No cost-map download at start (the proxy starts offline too).
export LITELLM_LOCAL_MODEL_COST_MAP="${LITELLM_LOCAL_MODEL_COST_MAP:-True}"

exec litellm --config "${LITELLM_CONFIG:-/etc/litellm/config.yaml}" \
    --host "${LITELLM_HOST:-0.0.0.0}" --port "${LITELLM_PORT:-4000}" --num_workers 1 "$@"
