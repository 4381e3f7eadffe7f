package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSServer is a nats-server with JetStream running as a separate process,
// so that its CPU time can be read apart from the bridge's.
type NATSServer struct {
	Cmd  *exec.Cmd
	Port int
	Dir  string
	done chan struct{}
}

// StartNATSServer starts bin (nats-server) with JetStream in dir on a free
// loopback port and waits until JetStream answers.
func StartNATSServer(ctx context.Context, bin, dir string) (*NATSServer, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(dir, "nats-server.log"))
	if err != nil {
		return nil, err
	}
	args := []string{"-js", "-sd", filepath.Join(dir, "store"), "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-n", "bench"}
	if p := os.Getenv("BENCH_NATS_PROFPORT"); p != "" { // research: pprof of the server over HTTP
		args = append(args, "--profile", p)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	s := &NATSServer{Cmd: cmd, Port: port, Dir: dir, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(s.done) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := s.ping(ctx)
		if err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("nats-server exited at start; see %s", filepath.Join(dir, "nats-server.log"))
		default:
		}
		if time.Now().After(deadline) {
			s.Stop()
			return nil, fmt.Errorf("nats-server not ready after 20s: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *NATSServer) ping(ctx context.Context) error {
	nc, err := nats.Connect(s.URL(), nats.Timeout(time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = js.AccountInfo(cctx)
	return err
}

// URL is the client URL.
func (s *NATSServer) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", s.Port) }

// PID is the server's process id.
func (s *NATSServer) PID() int { return s.Cmd.Process.Pid }

// Stop terminates the server (SIGTERM, then SIGKILL after 10s) and waits.
func (s *NATSServer) Stop() {
	select {
	case <-s.done:
		return
	default:
	}
	_ = s.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		_ = s.Cmd.Process.Kill()
		<-s.done
	}
}

// FreePort returns a free loopback TCP port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Connect dials the server for the driver's own use (polling, reading back).
func (s *NATSServer) Connect() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(s.URL(), nats.Name("benchrun"))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}
