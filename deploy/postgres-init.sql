-- Run by the official postgres image on its first start (empty data volume),
-- as the POSTGRES_USER of docker-compose.yaml's `postgres` service, who then
-- owns these databases. One database per store: the coder replicas' A2A
-- task store and the scaled orchestrator's store each keep their own tables.
CREATE DATABASE a2a_coder;
CREATE DATABASE a2a_orchestrator;
