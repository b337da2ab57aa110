"""The docker-compose deployment started on this machine (`make stack-up`, `stack-drill`,
`stack-down`): docker-compose.yml as shipped, with deploy/local/docker-compose.local.yml on
top for what only a machine without a container registry needs (images built here from
Debian's packages, PyPI and Maven Central; host networking on loopback ports)."""

# The round trip between the stack's locations (settlement/stack/wan.py): two data centres in
# one metro. Here, not in wan.py, so the CLI reads it without importing the stack's modules.
DEFAULT_WAN_RTT_MS = 2.0

# The Compose project every container and volume of the stack is named by (and filtered by:
# `docker ps`/`volume ls`). Here so netcut and the WAN need not import compose.
PROJECT = "dual-site-settlement"
PROJECT_FILTER = f"label=com.docker.compose.project={PROJECT}"
