-- Run once by the postgres image on an empty volume: the databases the product uses.
-- Tables come from sql/migrations through the `migrate` service.
CREATE DATABASE ledger_a;
CREATE DATABASE ledger_b;
CREATE DATABASE ledger_shared;
CREATE DATABASE airflow;
