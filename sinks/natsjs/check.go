package natsjs

import (
	"fmt"
	"slices"

	"github.com/bridgecdc/bridge/sinks"
)

// AcceptedSubjects implements sinks.SubjectLimiter: with create_stream the
// stream is made to bind the configured subjects (and the dead-letter
// subject), and a route must stay within them; without it only the
// server's stream knows (Check reads it).
func (s *Sink) AcceptedSubjects() (sinks.SubjectSet, bool) {
	if !s.cfg.CreateStream {
		return sinks.SubjectSet{}, false
	}
	return sinks.SubjectSet{Filters: slices.Clone(s.cfg.Subjects), Of: fmt.Sprintf("stream %q", s.cfg.Stream), Key: "subjects"}, true
}

var _ sinks.SubjectLimiter = (*Sink)(nil)
