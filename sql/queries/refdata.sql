-- Named statements of the reference data (settlement/instructions/refdata.py; tables in
-- migration 0017).

-- name: isin_taken
-- ISINs of the file already stored for another symbol.
select s.isin, s.symbol from securities s
join unnest(%(symbols)s::text[], %(isins)s::text[]) as f (symbol, isin)
    on f.isin = s.isin and f.symbol <> s.symbol
order by 1

-- name: upsert_security
-- A row back only when written (true: added); the same line again writes nothing.
insert into securities as s (symbol, isin, cusip, currency, source_file)
values (%(symbol)s, %(isin)s, %(cusip)s, %(currency)s, %(source_file)s)
on conflict (symbol) do update
    set isin = excluded.isin, cusip = excluded.cusip, currency = excluded.currency,
        source_file = excluded.source_file, loaded_at = now()
    where (s.isin, s.cusip, s.currency) is distinct from
          (excluded.isin, excluded.cusip, excluded.currency)
returning xmax = 0

-- name: upsert_participant
insert into participants as p (account, participant_id, bic, safekeeping_account, source_file)
values (%(account)s, %(participant_id)s, %(bic)s, %(safekeeping_account)s, %(source_file)s)
on conflict (account) do update
    set participant_id = excluded.participant_id, bic = excluded.bic,
        safekeeping_account = excluded.safekeeping_account,
        source_file = excluded.source_file, loaded_at = now()
    where (p.participant_id, p.bic, p.safekeeping_account) is distinct from
          (excluded.participant_id, excluded.bic, excluded.safekeeping_account)
returning xmax = 0

-- name: securities_of
-- The instruments a set of instructions names (custodian mode's messages).
select symbol, isin, cusip, currency from securities where symbol = any(%(symbols)s)

-- name: participants_of
select account, participant_id, bic, safekeeping_account from participants
where account = any(%(accounts)s)
