-- Ledger tables: what a consumer site writes. Applied to every ledger database (and the
-- settlement database, so one schema serves every role). Runnable with psql as is.

-- One row per trade, whichever site ingested it. trade_id is the idempotency key: an
-- upstream replay of the same trade lands on a different Kafka offset and is suppressed.
create table trades (
    trade_id        text primary key,
    trade_date      date        not null,
    seq             bigint      not null check (seq > 0),
    kafka_partition integer     not null,
    kafka_offset    bigint      not null,
    symbol          text        not null,
    price           numeric(18, 4) not null check (price > 0),
    quantity        bigint      not null check (quantity > 0),
    buyer           text        not null,
    seller          text        not null check (seller <> buyer),
    executed_at     timestamptz not null,
    site            text        not null,
    ingested_at     timestamptz not null default now()
);
create index trades_date_partition_seq on trades (trade_date, kafka_partition, seq);

-- Messages that could not be parsed or validated: kept byte for byte with the reason.
create table dead_letters (
    topic           text        not null,
    kafka_partition integer     not null,
    kafka_offset    bigint      not null,
    raw             bytea       not null,
    reason          text        not null,
    site            text        not null,
    received_at     timestamptz not null default now(),
    primary key (topic, kafka_partition, kafka_offset)
);

-- The consumed position, written in the same transaction as the trades it covers. This,
-- not Kafka's committed offset, is where a site resumes (seed 000, seed 004 scheme 2).
-- next_offset = -1 means "from the beginning of the partition".
create table consumer_offsets (
    consumer_group  text        not null,
    topic           text        not null,
    kafka_partition integer     not null,
    next_offset     bigint      not null,
    site            text        not null,
    updated_at      timestamptz not null default now(),
    primary key (consumer_group, topic, kafka_partition)
);

-- Market-close markers: the last exchange sequence number of the day per partition.
create table close_markers (
    trade_date      date        not null,
    kafka_partition integer     not null,
    last_seq        bigint      not null check (last_seq >= 0),
    kafka_offset    bigint      not null,
    site            text        not null,
    ingested_at     timestamptz not null default now(),
    primary key (trade_date, kafka_partition)
);

-- One row per site per second while it runs: liveness and what it owned.
create table site_heartbeats (
    id              bigserial   primary key,
    site            text        not null,
    scheme          text        not null,
    beat_at         timestamptz not null default now(),
    partitions      integer[]   not null,
    trades_total    bigint      not null
);
create index site_heartbeats_site_time on site_heartbeats (site, beat_at);

-- One row per committed batch: throughput over the day and duplicates suppressed.
create table ingest_batches (
    id              bigserial   primary key,
    site            text        not null,
    committed_at    timestamptz not null default now(),
    messages        integer     not null,
    inserted        integer     not null,
    duplicates      integer     not null,
    dead_letters    integer     not null,
    close_markers   integer     not null,
    partitions      integer[]   not null,
    duration_ms     numeric(12, 3) not null
);
create index ingest_batches_time on ingest_batches (committed_at);
