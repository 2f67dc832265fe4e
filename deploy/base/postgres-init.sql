-- The agents' durable stores, one database each (run once, on a fresh PostgreSQL volume).
-- Kubernetes: configMapGenerator postgres-init (deploy/base); compose: mounted into the postgres service.
CREATE DATABASE agents_tracker OWNER scanflow;
CREATE DATABASE agents_checker OWNER scanflow;
CREATE DATABASE agents_planner OWNER scanflow;
CREATE DATABASE agents_executor OWNER scanflow;
