# The jobledger image docker-compose.yml runs (workers, projections + outbox, reconciler,
# the HTTP API, and the kafka-service profile's example, whose JSON Schema needs the
# subscriptions extra).
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
COPY projections ./projections
RUN pip install --no-cache-dir ".[http,subscriptions]" && useradd --system --uid 10001 jobledger
COPY examples ./examples
USER jobledger
ENTRYPOINT ["jobledger"]
CMD ["--help"]
