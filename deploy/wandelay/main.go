// wandelay holds every packet netfilter queues to it for a fixed time, then lets it go: the
// one-way latency of the WAN between the local stack's locations. The kernel here has no
// netem qdisc (nor fq, for a BPF departure time), so the delay is taken in user space: the
// stack's iptables rules (settlement/stack/wan.py) send only cross-location packets to this
// queue, with --queue-bypass, so a stopped delayer leaves the links fast, never cut.
//
// Each packet's verdict waits until its arrival plus -delay, give or take up to -jitter
// (uniform), but never before the packet ahead of it: a FIFO keeps TCP's order, so jitter
// delays a burst rather than reordering it (as netem does with a rate). -loss drops that
// fraction of them instead (random, independent).
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	nfqueue "github.com/florianl/go-nfqueue/v2"
	"github.com/mdlayher/netlink"
)

type held struct {
	id  uint32
	due time.Time
}

func main() {
	queue := flag.Uint("queue", 7, "the NFQUEUE number the iptables rules send packets to")
	delay := flag.Duration("delay", 2*time.Millisecond, "one-way delay added to each packet")
	jitter := flag.Duration("jitter", 0, "each packet's delay varies by up to this either way")
	loss := flag.Float64("loss", 0, "fraction of packets dropped (0 to 1)")
	every := flag.Duration("report", 10*time.Second, "how often to print the counters")
	flag.Parse()
	if *delay < 0 || *jitter < 0 || *jitter > *delay || *loss < 0 || *loss > 1 || *queue > 65535 {
		fmt.Fprintln(os.Stderr, "wandelay: -delay must be >= 0, -jitter within 0..delay, "+
			"-loss within 0..1, -queue < 65536")
		os.Exit(2)
	}

	nf, err := nfqueue.Open(&nfqueue.Config{
		NfQueue:     uint16(*queue),
		MaxQueueLen: 1 << 16,
		Copymode:    nfqueue.NfQnlCopyMeta, // verdicts need the id only, never the payload
		// FailOpen: a full queue lets packets through undelayed rather than dropping them;
		// GSO: loopback's 64 KB segments are queued whole, not cut up first.
		Flags:        nfqueue.NfQaCfgFlagFailOpen | nfqueue.NfQaCfgFlagGSO,
		WriteTimeout: time.Second,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "wandelay: cannot open queue %d (root and the nfnetlink_queue "+
			"module are needed): %v\n", *queue, err)
		os.Exit(1)
	}
	defer nf.Close()
	_ = nf.SetOption(netlink.NoENOBUFS, true)
	_ = nf.Con.SetReadBuffer(8 << 20)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	pending := make(chan held, 1<<20)
	var seen, passed, dropped atomic.Uint64
	var last time.Time // the previous packet's due time (the hook runs in one goroutine)
	hook := func(a nfqueue.Attribute) int {
		if a.PacketID == nil {
			return 0
		}
		seen.Add(1)
		wait := *delay
		if *jitter > 0 {
			wait += time.Duration(rand.Int64N(int64(2**jitter)+1)) - *jitter
		}
		due := time.Now().Add(wait)
		if due.Before(last) {
			due = last
		}
		last = due
		pending <- held{*a.PacketID, due}
		return 0
	}
	onError := func(e error) int {
		if ctx.Err() != nil {
			return 1
		}
		fmt.Fprintf(os.Stderr, "wandelay: reading the queue: %v\n", e)
		return 0 // an overrun loses a notification, not the reader
	}
	if err := nf.RegisterWithErrorFunc(ctx, hook, onError); err != nil {
		fmt.Fprintf(os.Stderr, "wandelay: cannot register on queue %d: %v\n", *queue, err)
		os.Exit(1)
	}

	go func() {
		for p := range pending {
			if wait := time.Until(p.due); wait > 0 {
				// nanosleep, not time.Sleep: Go's timers wait on epoll in whole milliseconds
				// here, which held every packet about a millisecond too long.
				ts := syscall.NsecToTimespec(int64(wait))
				_ = syscall.Nanosleep(&ts, nil)
			}
			verdict := nfqueue.NfAccept
			if *loss > 0 && rand.Float64() < *loss {
				verdict = nfqueue.NfDrop
				dropped.Add(1)
			} else {
				passed.Add(1)
			}
			if err := nf.SetVerdict(p.id, verdict); err != nil && ctx.Err() == nil {
				fmt.Fprintf(os.Stderr, "wandelay: verdict for packet %d: %v\n", p.id, err)
			}
		}
	}()

	fmt.Printf("wandelay: queue %d, one-way delay %s, jitter %s, loss %.4f\n", *queue, *delay,
		*jitter, *loss)
	tick := time.NewTicker(*every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Printf("wandelay: stopped; %d packets seen, %d passed, %d dropped\n",
				seen.Load(), passed.Load(), dropped.Load())
			return
		case <-tick.C:
			fmt.Printf("wandelay: %d packets seen, %d passed, %d dropped, %d held\n",
				seen.Load(), passed.Load(), dropped.Load(), len(pending))
		}
	}
}
