-- The agents' durable stores: one database per agent, each owned by a login role of its own that can do
-- nothing else (not a superuser, no CREATEDB, no CREATEROLE), and no one else may connect to it. An
-- agent's credential then reaches its own store only: never MLflow's database, nor another agent's.
-- Run once, on a fresh PostgreSQL volume, by the postgres image's entrypoint as the superuser (psql >= 15
-- for \getenv). The passwords come from the container's env, <AGENT>_STORE_PASSWORD (the Secret keys
-- `<agent>-store-password`, scanflow/deploy_secrets.py); a missing one stops the script with an error.
-- Kubernetes: configMapGenerator postgres-init (deploy/base); compose: mounted into the postgres service.
\set ON_ERROR_STOP on
\getenv tracker_password TRACKER_STORE_PASSWORD
\getenv checker_password CHECKER_STORE_PASSWORD
\getenv planner_password PLANNER_STORE_PASSWORD
\getenv executor_password EXECUTOR_STORE_PASSWORD

CREATE ROLE agent_tracker LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'tracker_password';
CREATE ROLE agent_checker LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'checker_password';
CREATE ROLE agent_planner LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'planner_password';
CREATE ROLE agent_executor LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE PASSWORD :'executor_password';

CREATE DATABASE agents_tracker OWNER agent_tracker;
CREATE DATABASE agents_checker OWNER agent_checker;
CREATE DATABASE agents_planner OWNER agent_planner;
CREATE DATABASE agents_executor OWNER agent_executor;

-- every database lets PUBLIC connect by default: only its owner (and the superuser) may
REVOKE ALL ON DATABASE agents_tracker FROM PUBLIC;
REVOKE ALL ON DATABASE agents_checker FROM PUBLIC;
REVOKE ALL ON DATABASE agents_planner FROM PUBLIC;
REVOKE ALL ON DATABASE agents_executor FROM PUBLIC;
REVOKE ALL ON DATABASE mlflow FROM PUBLIC;
