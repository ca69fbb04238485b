# One image for every service of the network: the orchestrator and each role
# server run the same `a2a-orchestrator` command and differ only in their
# arguments (see docker-compose.yaml), so there is one thing to build, scan
# and ship.
#
#   docker build -t a2a-orchestrator .
#   docker run --rm -p 9102:9102 a2a-orchestrator serve coder --host 0.0.0.0 --port 9102
#
# No HEALTHCHECK here: each service listens on its own port, so
# docker-compose.yaml defines one per service (it fetches the agent card).

# The oldest Python the project supports (requires-python >= 3.11), slim to
# keep the image small; everything it needs installs from wheels, so no
# compiler is added.
FROM python:3.11-slim

# No .pyc files written at run time into a read-only-ish layer, output not
# held back in a buffer (docker logs shows it at once), no pip version nag.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# A non-root user: the roles run model-chosen shell commands (run_command) and
# write files, so they should not do that as root. A fixed uid lets the work
# volume be shared by every container and bind-mounted from a host with a
# matching owner. /work and /data are created here, owned by that user,
# because Docker copies a mount point's ownership into a new named volume:
# without this the volumes would be root-owned and unwritable.
# bubblewrap: run_command sandboxes commands with it wherever the container is
# allowed to create namespaces (see docker-compose.yaml for what that takes;
# the compose file opts out explicitly instead).
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*

RUN groupadd --system --gid 10001 a2a \
    && useradd --system --uid 10001 --gid a2a --create-home --shell /usr/sbin/nologin a2a \
    && mkdir -p /work /data \
    && chown a2a:a2a /work /data

# Only what the wheel is built from (pyproject.toml, the README it names as
# its readme, the package, and the roles/ and agents/ it bundles), so an edit
# to tests or benchmarks does not invalidate the install layer.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY a2a_orchestrator/ a2a_orchestrator/
COPY roles/ roles/
COPY agents/ agents/
# A regular (not editable) install: the shipped roles and agents then live
# inside the installed package, so lookup finds them from any directory. The
# postgresql extra (its drivers) lets the same image run as replicas sharing
# a PostgreSQL store (docker-compose.yaml's `scale` profile, deploy/).
RUN pip install --no-cache-dir .[postgresql]

USER a2a

# The work directory: tools are confined to it and it is where the project
# being worked on lives; with no --db a server keeps its task store under
# .a2a/ here too. A volume, so the work outlives the container.
WORKDIR /work
VOLUME ["/work"]

# 9100 the orchestrator, 9101-9104 architect, coder, reviewer, observer.
EXPOSE 9100 9101 9102 9103 9104

# Exec form: the server is the process that receives SIGTERM from
# `docker stop`, fails its running tasks (reason "lost") and exits cleanly.
ENTRYPOINT ["a2a-orchestrator"]
# Listen on every interface: the default 127.0.0.1 is unreachable from
# outside the container. Override the arguments to serve a role instead,
# e.g. `serve coder --host 0.0.0.0 --port 9102`.
CMD ["serve", "orchestrator", "--host", "0.0.0.0"]
