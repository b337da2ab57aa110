"""Kafka administration (topics) and security (SCRAM users, ACLs)."""
