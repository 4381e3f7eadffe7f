// Package reload keeps what a long-running listener reads from files
// current without restarting the process: Watch calls a function when
// files change or on a signal, and ServerTLS serves a certificate (and
// the CAs of mutual TLS) that it reloads, keeping the previous one when a
// new file does not load.
package reload

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"
)

// settle folds the events of one update (a certificate written, then its
// key; Kubernetes swapping its ..data link) into one call.
const settle = 100 * time.Millisecond

// Watch calls fn, from one goroutine, each time trigger receives (e.g. on
// SIGHUP) and once the directories holding files have been quiet for a
// moment after a change: a file written, replaced, renamed or re-linked,
// as editors, cert-manager and Kubernetes' secret volumes do. It watches
// directories, not files, so that a file replaced by a rename is still
// seen. It returns once the watch is set up, and stops when ctx ends.
// A nil trigger is never ready.
func Watch(ctx context.Context, log *slog.Logger, files []string, trigger <-chan struct{}, fn func()) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watching %v for changes: %w", files, err)
	}
	var dirs []string
	for _, f := range files {
		if d := filepath.Dir(f); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	for _, d := range dirs {
		if err := w.Add(d); err != nil {
			_ = w.Close()
			return fmt.Errorf("watching directory %s for changes: %w", d, err)
		}
	}
	go func() {
		defer w.Close()
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		defer timer.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-trigger:
				timer.Stop()
				fn()
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Op == fsnotify.Chmod {
					continue
				}
				timer.Reset(settle)
			case err, ok := <-w.Errors:
				if !ok {
					return
				}
				log.Warn("watching files for changes", "dirs", dirs, "err", err)
			case <-timer.C:
				fn()
			}
		}
	}()
	return nil
}

// OnSIGHUP returns a channel that receives each SIGHUP until ctx ends: the
// conventional signal to reload files, for Watch's trigger. Once
// subscribed, SIGHUP no longer ends the process.
func OnSIGHUP(ctx context.Context) <-chan struct{} {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGHUP)
	out := make(chan struct{})
	go func() {
		defer signal.Stop(sig)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sig:
				select {
				case out <- struct{}{}:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out
}
