# FiloPy image: one image for the head (Ray head, cluster singleton, REST API) and the workers
# (Ray nodes offering the filopy_node resource). Built from this repository.
FROM python:3.11-slim

WORKDIR /opt/filopy
# Installed editable so the code finds config/filopy.toml beside it.
COPY pyproject.toml README.md ./
COPY core ./core
COPY store ./store
COPY ingest ./ingest
COPY query ./query
COPY coordinator ./coordinator
COPY filopy ./filopy
COPY config ./config
RUN pip install --no-cache-dir -e .
# The ingestion decoders' numba kernels compiled into the image (ingest/jit.py): a gateway then
# starts in a fraction of a second, not ~5 s (numba recompiles on a CPU unlike the builder's).
RUN python -c "import filopy.ingest_http.app; from ingest.jit import warm; warm()"

# Containers talk over the compose network, not loopback.
ENV FILOPY_RAY_LOOPBACK=0 \
    RAY_USAGE_STATS_ENABLED=0

EXPOSE 8080 6379
CMD ["filopy", "--help"]
