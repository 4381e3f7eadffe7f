package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/bridgecdc/bridge/bench"
	"github.com/bridgecdc/bridge/internal/natsembed"
)

// TestExactlyOnceAcrossRestarts runs the pipe binary three times on one
// slot: killed (SIGKILL) before any checkpoint, so the next run publishes
// everything again and the duplicate window must drop it; then stopped with
// SIGTERM, which must leave a checkpoint; then resumed from it. The stream
// must hold every change once, in order, with ids bench.Verify accepts.
func TestExactlyOnceAcrossRestarts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	work, err := os.MkdirTemp("", "pipe-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(work)
	_ = os.Chmod(work, 0o755) // the postgres OS user must traverse it
	bin := filepath.Join(work, "pipe")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	pg, err := bench.StartPG(ctx, work, 16)
	if err != nil {
		t.Fatalf("starting postgres: %v", err)
	}
	defer pg.Close()
	srv := natsembed.StartT(t, natsembed.Options{})
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const slot, stream = "pipe_test", "PIPE_TEST"
	if err := pg.CreateSlot(ctx, slot, "pgoutput"); err != nil {
		t.Fatal(err)
	}
	run := 0
	start := func(every string) *bench.Proc {
		t.Helper()
		run++
		p, err := bench.StartProc("pipe", bin, []string{"-dsn", pg.Server.DSN(""), "-slot", slot, "-publication", bench.Publication,
			"-nats", srv.URL(), "-stream", stream, "-prefix", "t", "-bucket", "pipe_test", "-key", "k", "-checkpoint-every", every},
			filepath.Join(work, "pipe-"+strconv.Itoa(run)+".log"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Stop(10 * time.Second) })
		return p
	}
	waitStored := func(p *bench.Proc, n int) {
		t.Helper()
		if _, err := bench.WaitStored(ctx, js, stream, n, time.Minute, 20*time.Millisecond, p.Exited); err != nil {
			t.Fatal(err)
		}
	}
	load := func(txns, rows int) {
		t.Helper()
		var err error
		if txns == 0 {
			_, err = pg.LoadSingle(ctx, rows)
		} else {
			_, err = pg.LoadBig(ctx, txns, rows)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	kvLSN := func() string {
		t.Helper()
		kv, err := js.KeyValue(ctx, "pipe_test")
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, "k")
		if err != nil {
			t.Fatalf("checkpoint: %v", err)
		}
		return string(e.Value())
	}

	// 1: no checkpoint before the kill.
	load(0, 200)
	p := start("1h")
	waitStored(p, 200)
	if err := p.Cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = p.Stop(10 * time.Second)

	// 2: everything again from the slot's start, the first 200 dropped as
	// duplicates; SIGTERM leaves a checkpoint.
	load(2, 100)
	p = start("100ms")
	waitStored(p, 400)
	time.Sleep(300 * time.Millisecond) // past a late duplicate, if any
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("stopping: %v", err)
	}
	first := kvLSN()

	// 3: resumes from the checkpoint.
	load(0, 50)
	p = start("100ms")
	waitStored(p, 450)
	time.Sleep(300 * time.Millisecond)
	if err := p.Stop(10 * time.Second); err != nil {
		t.Fatalf("stopping: %v", err)
	}
	if again := kvLSN(); again == first {
		t.Errorf("checkpoint still %s after the third run", again)
	}
	v, err := bench.Verify(ctx, js, stream, true)
	if err != nil {
		t.Fatal(err)
	}
	if !v.OK(450) || len(v.Latencies) != 450 {
		t.Errorf("read back %d msgs, %d duplicates, %d out of order, %d bad ids, %d commit times; want 450 once each, in order",
			v.Msgs, v.Duplicates, v.OutOfOrder, v.BadIDs, len(v.Latencies))
	}
	if sig := p.Cmd.ProcessState.Sys().(syscall.WaitStatus); sig.Signaled() {
		t.Errorf("the pipe ended by %s, not by itself after SIGTERM", sig.Signal())
	}
}
