package settle;

import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.time.Duration;
import java.time.LocalDate;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.UUID;
import java.util.NoSuchElementException;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import org.apache.spark.util.TaskCompletionListener;

/**
 * Plain trades and day's close markers classified inside the JVM, per Kafka partition in
 * offset order, with the Python classifier's verdicts (settlement.spark.jvmclassify says what
 * and why; tests/test_native.py holds the two to the same rows).
 *
 * <p>A message is classified here when its type header is "trade" and its value matches the
 * canonical trade pattern (generated in Python from the contract: settlement.spark.canonical),
 * its integers within the contract's bounds and buyer and seller different; or "close" and a
 * day's close marker's canonical text naming its own partition. Such a value has no escape and
 * is ASCII, so its fields are the pattern's groups.
 *
 * <p>Any other message (an amendment, an amended close, a malformed or unusual value: a few per
 * partition on the days exchanges send) is deferred: emitted with {@code _deferred} set, its
 * value in {@code raw} and its type header's bytes in {@code _type}, leaving this partition's
 * state as it was; with the trade id it seems to name in {@code trade_id} and, when this
 * partition kept that trade before it, the kept copy's offset and date in {@code _ref_offset}
 * and {@code _ref_date} (what an amendment is checked against). The caller decides the deferred messages with the Python classifier and the
 * state they need (settlement.spark.jvmclassify.resolve_deferred), and gives a partition back
 * to the Python worker, whole, only when a deferred message turns out to change the state the
 * messages after it were classified with (a valid trade or close marker this class did not
 * vouch for). A partition with more than {@code deferLimit} deferred messages is given back
 * here: one row with {@code _fallback} set, its other messages skipped.
 */
public final class KafkaClassifier
    implements FlatMapFunction<Iterator<InternalRow>, InternalRow>, Serializable {
  private static final long serialVersionUID = 1L;

  /**
   * What {@link #classify} returns per message: settlement.spark.parse.CLASSIFIED_SCHEMA and
   * {@code _fallback} (tests/test_native.py holds the two to each other). Rows are built in
   * Spark's internal form (days, microseconds, UTF8String, Decimal): no encoder runs per row.
   */
  public static final StructType OUT = new StructType(new StructField[] {
      DataTypes.createStructField("kafka_partition", DataTypes.IntegerType, true),
      DataTypes.createStructField("kafka_offset", DataTypes.LongType, true),
      DataTypes.createStructField("reason", DataTypes.StringType, true),
      DataTypes.createStructField("_kind", DataTypes.StringType, true),
      DataTypes.createStructField("raw", DataTypes.BinaryType, true),
      DataTypes.createStructField("trade_id", DataTypes.StringType, true),
      DataTypes.createStructField("trade_date", DataTypes.DateType, true),
      DataTypes.createStructField("seq", DataTypes.LongType, true),
      DataTypes.createStructField("symbol", DataTypes.StringType, true),
      DataTypes.createStructField("price", DataTypes.createDecimalType(18, 4), true),
      DataTypes.createStructField("quantity", DataTypes.LongType, true),
      DataTypes.createStructField("buyer", DataTypes.StringType, true),
      DataTypes.createStructField("seller", DataTypes.StringType, true),
      DataTypes.createStructField("executed_at", DataTypes.TimestampType, true),
      DataTypes.createStructField("_close_date", DataTypes.DateType, true),
      DataTypes.createStructField("_last_seq", DataTypes.LongType, true),
      DataTypes.createStructField("_dup", DataTypes.BooleanType, true),
      DataTypes.createStructField("_version", DataTypes.IntegerType, true),
      DataTypes.createStructField("_note", DataTypes.StringType, true),
      DataTypes.createStructField("_row_hi", DataTypes.LongType, true),
      DataTypes.createStructField("_row_lo", DataTypes.LongType, true),
      DataTypes.createStructField("_fallback", DataTypes.BooleanType, true),
      DataTypes.createStructField("_deferred", DataTypes.BooleanType, true),
      DataTypes.createStructField("_type", DataTypes.BinaryType, true),
      DataTypes.createStructField("_ref_offset", DataTypes.LongType, true),
      DataTypes.createStructField("_ref_date", DataTypes.DateType, true),
  });

  private static final byte[] TRADE = "trade".getBytes(StandardCharsets.US_ASCII);
  private static final byte[] CLOSE = "close".getBytes(StandardCharsets.US_ASCII);
  private static final char SEPARATOR = '\u001f';
  private static final UTF8String TRADE_KIND = UTF8String.fromString("trade");
  private static final UTF8String CLOSE_KIND = UTF8String.fromString("close");
  private static final int FALLBACK = OUT.size() - 5;
  private static final int DEFERRED = OUT.size() - 4;
  private static final int TYPE = OUT.size() - 3;
  private static final int REF_OFFSET = OUT.size() - 2;
  private static final int REF_DATE = OUT.size() - 1;
  private static final int TRADE_ID = 5;
  // The trade id a deferred value seems to name (its first "trade_id" string without an
  // escape): a hint the driver checks against the Python parser's reading of the value.
  private static final Pattern NAMED_ID =
      Pattern.compile("\"trade_id\"\\s*:\\s*\"([^\"\\\\]{1,200})\"");

  private final String tradePattern;
  private final String closePattern;
  private final long maxBytes;
  private final long seqMax;
  private final long quantityMax;
  private final long lastSeqMax;
  // The reasons' wordings (consumers.parse), with tokens where the values go: \u0001 then
  // day, p (partition), id (the quoted trade id), seq, kseq and koff (the kept one's).
  private final String late;
  private final String conflict;
  private final String markerConflict;
  // What a message without a type header is (settlement.contract.MISSING_TYPE_MEANS).
  private final String missingType;
  // The header naming a message's type (settlement.contract.TYPE_HEADER).
  private final String typeHeader;
  // Deferred messages a partition may have before it is given to the Python worker whole
  // (they are decided in the driver: settlement.spark.jvmclassify.DEFER_LIMIT says why).
  private final long deferLimit;

  public KafkaClassifier(String tradePattern, String closePattern, long maxBytes, long seqMax,
      long quantityMax, long lastSeqMax, String late, String conflict, String markerConflict,
      String missingType, String typeHeader, long deferLimit) {
    this.tradePattern = tradePattern;
    this.closePattern = closePattern;
    this.maxBytes = maxBytes;
    this.seqMax = seqMax;
    this.quantityMax = quantityMax;
    this.lastSeqMax = lastSeqMax;
    this.late = late;
    this.conflict = conflict;
    this.markerConflict = markerConflict;
    this.missingType = missingType;
    this.typeHeader = typeHeader;
    this.deferLimit = deferLimit;
  }

  /**
   * Each staged message (kafka_partition int, kafka_offset long, value binary, _kind binary),
   * one Spark partition's messages in offset order per Kafka partition, classified: OUT.
   */
  public Dataset<Row> classify(Dataset<Row> staged) {
    Dataset<Row> in = staged.select("kafka_partition", "kafka_offset", "value", "_kind");
    RDD<InternalRow> rows = ((org.apache.spark.sql.classic.Dataset<Row>) in).queryExecution()
        .toRdd().toJavaRDD().mapPartitions(this).rdd();
    return session(in.sparkSession()).internalCreateDataFrame(rows, OUT, false);
  }

  private static org.apache.spark.sql.classic.SparkSession session(SparkSession spark) {
    return (org.apache.spark.sql.classic.SparkSession) spark;
  }

  @Override
  public Iterator<InternalRow> call(Iterator<InternalRow> input) {
    Task task = new Task();
    return new Lazy<>(input, in -> task.classifyOne(in.getInt(0), in.getLong(1),
        in.isNullAt(2) ? null : in.getBinary(2), in.isNullAt(3) ? null : in.getBinary(3)));
  }

  /**
   * Kafka offset ranges read and classified, one Spark task per range, longest first as
   * given: {@code partitions}, {@code starts}, {@code ends} side by side. Each task reads its
   * range with a consumer of its own ({@code consumer}: the client's settings, as Spark's
   * Kafka source takes them without their "kafka." prefix), read_committed, by assignment.
   * A range is read whole when its last offset (the day's close marker) arrives; no record
   * for {@code idleMillis} is a KafkaReadError naming where the read stopped.
   */
  public Dataset<Row> classifyRanges(SparkSession spark, Map<String, String> consumer,
      String topic, List<Number> partitions, List<Number> starts, List<Number> ends,
      long idleMillis) {
    int n = partitions.size();
    int[] ps = new int[n];
    long[] ss = new long[n];
    long[] es = new long[n];
    for (int i = 0; i < n; i++) {
      ps[i] = partitions.get(i).intValue();
      ss[i] = starts.get(i).longValue();
      es[i] = ends.get(i).longValue();
    }
    Map<String, String> props = new HashMap<>(consumer);
    RangeReader reader = new RangeReader(this, props, topic, ps, ss, es, idleMillis);
    List<Integer> ids = new java.util.ArrayList<>();
    for (int i = 0; i < n; i++) {
      ids.add(i);
    }
    RDD<InternalRow> rows = JavaSparkContext.fromSparkContext(spark.sparkContext())
        .parallelize(ids, Math.max(n, 1)).mapPartitions(reader).rdd();
    return session(spark).internalCreateDataFrame(rows, OUT, false);
  }

  /** Reads and classifies the ranges its task's ids name (classifyRanges). */
  private static final class RangeReader
      implements FlatMapFunction<Iterator<Integer>, InternalRow> {
    private static final long serialVersionUID = 1L;
    private final KafkaClassifier rules;
    private final Map<String, String> props;
    private final String topic;
    private final int[] partitions;
    private final long[] starts;
    private final long[] ends;
    private final long idleMillis;

    RangeReader(KafkaClassifier rules, Map<String, String> props, String topic,
        int[] partitions, long[] starts, long[] ends, long idleMillis) {
      this.rules = rules;
      this.props = props;
      this.topic = topic;
      this.partitions = partitions;
      this.starts = starts;
      this.ends = ends;
      this.idleMillis = idleMillis;
    }

    @Override
    public Iterator<InternalRow> call(Iterator<Integer> ids) {
      List<InternalRow> none = List.of();
      Iterator<InternalRow> out = none.iterator();
      while (ids.hasNext()) {
        int i = ids.next().intValue();
        out = concat(out, rules.readRange(props, topic, partitions[i], starts[i], ends[i],
            idleMillis));
      }
      return out;
    }
  }

  private static <T> Iterator<T> concat(Iterator<T> a, Iterator<T> b) {
    return new Iterator<T>() {
      @Override
      public boolean hasNext() {
        return a.hasNext() || b.hasNext();
      }

      @Override
      public T next() {
        return a.hasNext() ? a.next() : b.next();
      }
    };
  }

  /** One partition's range, read lazily as the task's rows are taken, and classified. */
  Iterator<InternalRow> readRange(Map<String, String> props, String topic, int p, long start,
      long end, long idleMillis) {
    Task task = new Task();
    Iterator<ConsumerRecord<byte[], byte[]>> records =
        new RangeRecords(props, topic, p, start, end, idleMillis);
    byte[] missing = missingType.getBytes(StandardCharsets.UTF_8);
    return new Lazy<>(records, r -> task.classifyOne(p, r.offset(), r.value(),
        typeOf(r.headers(), missing)));
  }

  /** The first type header's value (empty when null); none: the missing type's bytes. */
  byte[] typeOf(Headers headers, byte[] missing) {
    for (Header h : headers) {
      if (typeHeader.equals(h.key())) {
        return h.value() == null ? new byte[0] : h.value();
      }
    }
    return missing;
  }

  /** A partition's records in [start, end), read_committed, then the consumer is closed. */
  private static final class RangeRecords implements Iterator<ConsumerRecord<byte[], byte[]>> {
    private final KafkaConsumer<byte[], byte[]> consumer;
    private final TopicPartition tp;
    private final long start;
    private final long end;
    private final long idleMillis;
    private Iterator<ConsumerRecord<byte[], byte[]>> polled =
        List.<ConsumerRecord<byte[], byte[]>>of().iterator();
    private ConsumerRecord<byte[], byte[]> next;
    private long reached;
    private boolean done;
    private boolean closed;

    RangeRecords(Map<String, String> props, String topic, int p, long start, long end,
        long idleMillis) {
      Properties c = new Properties();
      c.putAll(props);
      c.put("group.id", "eod-probe-read-" + UUID.randomUUID().toString().replace("-", ""));
      c.put("isolation.level", "read_committed");
      c.put("enable.auto.commit", "false");
      // An offset retention deleted since the day was located is an error, not a jump.
      c.put("auto.offset.reset", "none");
      c.put("key.deserializer", ByteArrayDeserializer.class.getName());
      c.put("value.deserializer", ByteArrayDeserializer.class.getName());
      c.put("max.partition.fetch.bytes", String.valueOf(16 << 20));
      c.put("fetch.max.bytes", String.valueOf(64 << 20));
      c.put("max.poll.records", "10000");
      c.put("fetch.max.wait.ms", "10");
      this.tp = new TopicPartition(topic, p);
      this.start = start;
      this.end = end;
      this.idleMillis = idleMillis;
      this.reached = start - 1;
      this.done = end <= start;
      this.consumer = done ? null : new KafkaConsumer<>(c);
      if (consumer != null) {
        consumer.assign(List.of(tp));
        consumer.seek(tp, start);
        // A task that ends before its range does (failed, or its rows not all taken) still
        // closes its consumer and connections.
        TaskContext task = TaskContext.get();
        if (task != null) {
          task.addTaskCompletionListener((TaskCompletionListener) t -> finish());
        }
      }
    }

    @Override
    public boolean hasNext() {
      long deadline = System.currentTimeMillis() + idleMillis;
      while (next == null && !done) {
        if (polled.hasNext()) {
          ConsumerRecord<byte[], byte[]> r = polled.next();
          if (r.offset() < start || r.offset() <= reached) {
            continue;
          }
          if (r.offset() >= end) {
            finish();
            break;
          }
          reached = r.offset();
          next = r;
          if (reached >= end - 1) {
            finish();
          }
          break;
        }
        if (System.currentTimeMillis() > deadline) {
          finish();
          throw new KafkaReadError("the day's range was not read whole: no message for "
              + idleMillis / 1000 + " s at partition " + tp.partition() + " at offset "
              + (reached + 1) + " of [" + start + ", " + end + ")");
        }
        try {
          polled = consumer.poll(Duration.ofMillis(100)).records(tp).iterator();
        } catch (KafkaException e) {  // the client retries what can be retried itself
          finish();
          throw new KafkaReadError("Kafka refused the day's read: " + e.getMessage());
        }
      }
      return next != null;
    }

    @Override
    public ConsumerRecord<byte[], byte[]> next() {
      if (!hasNext()) {
        throw new NoSuchElementException();
      }
      ConsumerRecord<byte[], byte[]> r = next;
      next = null;
      return r;
    }

    private void finish() {
      if (consumer != null && !closed) {
        closed = true;
        consumer.close(Duration.ofSeconds(5));
      }
      done = true;
    }
  }

  /** The day's range could not be read whole (the driver raises it with these words). */
  public static final class KafkaReadError extends RuntimeException {
    private static final long serialVersionUID = 1L;

    KafkaReadError(String message) {
      super(message);
    }
  }

  /** Each input's row, skipping inputs that give none, as the task's rows are taken. */
  private static final class Lazy<T> implements Iterator<InternalRow> {
    private final Iterator<T> input;
    private final java.util.function.Function<T, InternalRow> f;
    private InternalRow next;

    Lazy(Iterator<T> input, java.util.function.Function<T, InternalRow> f) {
      this.input = input;
      this.f = f;
    }

    @Override
    public boolean hasNext() {
      while (next == null && input.hasNext()) {
        next = f.apply(input.next());
      }
      return next != null;
    }

    @Override
    public InternalRow next() {
      if (!hasNext()) {
        throw new NoSuchElementException();
      }
      InternalRow out = next;
      next = null;
      return out;
    }
  }

  /** A kept trade copy: its offset and its row hash (equal content, equal hash). */
  private static final class Kept {
    final long offset;
    final long hi;
    final long lo;
    final int days;

    Kept(long offset, long hi, long lo, int days) {
      this.offset = offset;
      this.hi = hi;
      this.lo = lo;
      this.days = days;
    }
  }

  /** A Kafka partition's state: the kept copy per trade id, the kept marker per date. */
  private static final class PartitionState {
    final Map<String, Kept> seen = new HashMap<>(1 << 16);
    final Map<Integer, long[]> closes = new HashMap<>(); // days -> {last_seq, offset}
  }

  /** One Spark task's classification state, message by message. */
  private final class Task {
    private final Matcher trade = Pattern.compile(tradePattern).matcher("");
    private final Matcher close = Pattern.compile(closePattern).matcher("");
    private final MessageDigest md5;
    private final Map<Integer, PartitionState> states = new HashMap<>();
    private final Set<Integer> fallback = new HashSet<>();
    private final Map<Integer, Long> deferred = new HashMap<>();
    private final Matcher named = NAMED_ID.matcher("");
    private final StringBuilder text = new StringBuilder(256);

    Task() {
      try {
        md5 = MessageDigest.getInstance("MD5");
      } catch (NoSuchAlgorithmException e) {
        throw new IllegalStateException(e);
      }
    }

    /**
     * The message's row (deferred when this class does not vouch for it), or null when its
     * partition is the Python worker's already.
     */
    InternalRow classifyOne(int p, long offset, byte[] value, byte[] kind) {
      if (fallback.contains(p)) {
        return null;
      }
      String ascii = value == null || value.length > maxBytes ? null : ascii(value);
      InternalRow out = null;
      if (ascii != null && java.util.Arrays.equals(kind, TRADE)) {
        out = trade(p, offset, value, ascii);
      } else if (ascii != null && java.util.Arrays.equals(kind, CLOSE)) {
        out = close(p, offset, value, ascii);
      }
      if (out != null) {
        return out;
      }
      long n = deferred.merge(p, 1L, Long::sum);
      Object[] row = new Object[OUT.size()];
      row[0] = p;
      if (n > deferLimit) {
        fallback.add(p);
        states.remove(p);
        row[FALLBACK] = true;
        return new GenericInternalRow(row);
      }
      row[1] = offset;
      row[4] = value;
      row[FALLBACK] = false;
      row[DEFERRED] = true;
      row[TYPE] = kind;
      // The trade the value seems to name, and where and of what date this partition kept it
      // so far: what an amendment is checked against, handed over without another pass.
      if (value != null && named.reset(new String(value, StandardCharsets.ISO_8859_1)).find()) {
        String id = named.group(1);
        row[TRADE_ID] = utf8(id);
        PartitionState st = states.get(p);
        Kept kept = st == null ? null : st.seen.get(id);
        if (kept != null) {
          row[REF_OFFSET] = kept.offset;
          row[REF_DATE] = kept.days;
        }
      }
      return new GenericInternalRow(row);
    }

    private PartitionState state(int p) {
      return states.computeIfAbsent(p, k -> new PartitionState());
    }

    private InternalRow trade(int p, long offset, byte[] value, String s) {
      if (!trade.reset(s).matches()) {
        return null;
      }
      String tradeId = trade.group(1);
      String date = trade.group(2);
      String symbol = trade.group(4);
      String buyer = trade.group(7);
      String seller = trade.group(8);
      long seq = Long.parseLong(trade.group(3));
      long quantity = Long.parseLong(trade.group(6));
      if (seq > seqMax || quantity > quantityMax || buyer.equals(seller)) {
        return null;
      }
      int days = days(date, 0);
      long units = units(trade.group(5));
      long micros = micros(trade.group(9));
      PartitionState st = state(p);
      long[] marker = st.closes.get(days);
      if (marker != null) {
        return malformed(p, offset, "trade", value, late.replace("\u0001day", date)
            .replace("\u0001p", Integer.toString(p)).replace("\u0001koff", Long.toString(marker[1])));
      }
      long[] hash = rowHash(tradeId, days, seq, p, symbol, units, quantity, buyer, seller,
          micros);
      Kept kept = st.seen.get(tradeId);
      boolean dup = false;
      if (kept == null) {
        st.seen.put(tradeId, new Kept(offset, hash[0], hash[1], days));
      } else if (kept.hi == hash[0] && kept.lo == hash[1]) {
        dup = true;
      } else {
        String id = tradeId.length() > 80 ? tradeId.substring(0, 80) : tradeId;
        String quote = id.indexOf('\'') >= 0 ? "\"" : "'";
        return malformed(p, offset, "trade", value, conflict
            .replace("\u0001id", quote + id + quote)
            .replace("\u0001p", Integer.toString(p)).replace("\u0001koff", Long.toString(kept.offset)));
      }
      return row(p, offset, null, TRADE_KIND, null, utf8(tradeId), days, seq, utf8(symbol),
          Decimal.createUnsafe(units, 18, 4), quantity, utf8(buyer), utf8(seller), micros, null,
          null, dup, null, null, hash[0], hash[1], false, false, null, null, null);
    }

    private InternalRow close(int p, long offset, byte[] value, String s) {
      if (!close.reset(s).matches()) {
        return null;
      }
      String date = close.group(1);
      if (close.group(2).length() > 10 || Long.parseLong(close.group(2)) != p) {
        return null;
      }
      long lastSeq = Long.parseLong(close.group(3));
      if (lastSeq > lastSeqMax) {
        return null;
      }
      int days = days(date, 0);
      PartitionState st = state(p);
      long[] held = st.closes.get(days);
      if (held == null) {
        st.closes.put(days, new long[] {lastSeq, offset});
      } else if (held[0] != lastSeq) {
        return malformed(p, offset, "close", value, markerConflict.replace("\u0001day", date)
            .replace("\u0001p", Integer.toString(p)).replace("\u0001seq", Long.toString(lastSeq))
            .replace("\u0001kseq", Long.toString(held[0]))
            .replace("\u0001koff", Long.toString(held[1])));
      }
      return row(p, offset, null, CLOSE_KIND, null, null, null, null, null, null, null, null,
          null, null, days, lastSeq, false, null, null, null, null, false, false, null, null,
          null);
    }

    private InternalRow malformed(int p, long offset, String kind, byte[] value, String reason) {
      return row(p, offset, utf8(reason), utf8(kind), value, null, null, null, null, null,
          null, null, null, null, null, null, false, null, null, null, null, false, false, null,
          null, null);
    }

    /**
     * The canonical row's hash (settlement.spark.figures.row_hash): md5 of the fields joined
     * by U+001F, its first 8 bytes big-endian as two unsigned 32-bit halves.
     */
    private long[] rowHash(String tradeId, int days, long seq, int p, String symbol,
        long units, long quantity, String buyer, String seller, long micros) {
      StringBuilder b = text;
      b.setLength(0);
      b.append(tradeId).append(SEPARATOR).append(days).append(SEPARATOR).append(seq)
          .append(SEPARATOR).append(p).append(SEPARATOR).append(symbol).append(SEPARATOR)
          .append(units).append(SEPARATOR).append(quantity).append(SEPARATOR).append(buyer)
          .append(SEPARATOR).append(seller).append(SEPARATOR).append(micros);
      byte[] d = md5.digest(b.toString().getBytes(StandardCharsets.US_ASCII));
      long hi = 0;
      long lo = 0;
      for (int i = 0; i < 4; i++) {
        hi = hi << 8 | (d[i] & 0xFF);
        lo = lo << 8 | (d[i + 4] & 0xFF);
      }
      return new long[] {hi, lo};
    }
  }

  private static InternalRow row(Object... values) {
    return new GenericInternalRow(values);
  }

  private static UTF8String utf8(String s) {
    return UTF8String.fromString(s);
  }

  /** The value as text when it is all ASCII (the patterns admit nothing else), else null. */
  static String ascii(byte[] value) {
    for (byte b : value) {
      if (b < 0) {
        return null;
      }
    }
    return new String(value, StandardCharsets.ISO_8859_1);
  }

  /** A calendar date's text (the pattern vouches for it) at {@code at}: days since 1970. */
  static int days(String s, int at) {
    int y = Integer.parseInt(s, at, at + 4, 10);
    int m = Integer.parseInt(s, at + 5, at + 7, 10);
    int d = Integer.parseInt(s, at + 8, at + 10, 10);
    return (int) LocalDate.of(y, m, d).toEpochDay();
  }

  /** A canonical price's text in 1/10,000 (at most 14 integer digits and 4 decimals). */
  static long units(String s) {
    int dot = s.indexOf('.');
    String whole = dot < 0 ? s : s.substring(0, dot);
    long units = Long.parseLong(whole) * 10_000L;
    if (dot >= 0) {
      long scale = 1_000L;
      for (int i = dot + 1; i < s.length(); i++, scale /= 10) {
        units += (s.charAt(i) - '0') * scale;
      }
    }
    return units;
  }

  /**
   * The contract's execution time (YYYY-MM-DDTHH:MM:SS, up to 6 decimals, Z or +hh:mm) in
   * microseconds since the epoch.
   */
  static long micros(String s) {
    long seconds = days(s, 0) * 86_400L + Integer.parseInt(s, 11, 13, 10) * 3_600L
        + Integer.parseInt(s, 14, 16, 10) * 60L + Integer.parseInt(s, 17, 19, 10);
    int i = 19;
    long fraction = 0;
    if (s.charAt(i) == '.') {
      long scale = 100_000L;
      for (i++; Character.isDigit(s.charAt(i)); i++, scale /= 10) {
        fraction += (s.charAt(i) - '0') * scale;
      }
    }
    if (s.charAt(i) != 'Z') {
      int sign = s.charAt(i) == '-' ? -1 : 1;
      seconds -= sign * (Integer.parseInt(s, i + 1, i + 3, 10) * 3_600L
          + Integer.parseInt(s, i + 4, i + 6, 10) * 60L);
    }
    return seconds * 1_000_000L + fraction;
  }
}
