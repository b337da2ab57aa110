-- Bad data never stops the line (issue 13): the day a dead letter claims, and the offset
-- ranges a site could no longer read. Runnable with psql as is.

-- The trade date a dead letter claims, where the site knows it: set for a trade that arrived
-- after its day's close marker on its partition (reason 'late: ...'), so the audit report of
-- that day can count it. Null for messages that never parsed to a date.
alter table dead_letters add column trade_date date;
create index dead_letters_trade_date on dead_letters (trade_date) where trade_date is not null;

-- A gap retention opened: the site's stored position on a partition was older than the
-- partition's log start (it was down longer than the topic's retention). Offsets
-- [from_offset, to_offset) were deleted unread; the site recorded this in the same
-- transaction that moved its position to the log start, and validation fails every day whose
-- offsets the gap may cover.
create table data_loss_events (
    topic           text        not null,
    kafka_partition integer     not null,
    from_offset     bigint      not null,  -- the stored position: first offset never read
    to_offset       bigint      not null,  -- the log start the site resumed from (exclusive)
    site            text        not null,
    detected_at     timestamptz not null default now(),
    primary key (topic, kafka_partition, from_offset),
    check (to_offset > from_offset)
);

grant select, insert on data_loss_events to settle_site;
grant select on data_loss_events to settle_settlement, settle_auditor;
