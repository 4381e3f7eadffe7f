package pipeline

import (
	"errors"
	"fmt"
)

// refusedError is a sink's refusal of part of a batch, naming the first
// refused change.
type refusedError struct {
	id  string // the first refused change's ID
	err error
}

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// refusals counts how many runs in a row ended with the same change
// refused, so that a change refused again and again is reported with its
// count and the last reason instead of as one more restart.
type refusals struct {
	id    string
	times int
}

// note records the error that ended a run and returns the refused change's
// ID and how many runs in a row refused it (0 when err is no refusal).
func (r *refusals) note(err error) (string, int) {
	var re *refusedError
	if !errors.As(err, &re) {
		r.id, r.times = "", 0
		return "", 0
	}
	if re.id == r.id {
		r.times++
	} else {
		r.id, r.times = re.id, 1
	}
	return r.id, r.times
}

// refusedAgain wraps err for the log once the same change was refused
// more than once.
func refusedAgain(id string, times int, err error) error {
	return fmt.Errorf("change %s refused %d times in a row; last reason: %w", id, times, err)
}
