package route

import (
	"fmt"
	"slices"

	"github.com/bridgecdc/bridge/bridge/cdc"
)

// ControlDest is where a control message goes: a sink (an index of the
// sinkIndex given to New) and its subject.
type ControlDest struct {
	Sink    int
	Subject string
}

// ControlDests returns where source's control messages of kind go. Routes
// whose match lists the control op (ops: [control]) decide alone when there
// are any; otherwise every sink of every route that can carry the source's
// changes gets one copy. Either way a sink gets one message, on the subject
// of the first such route (in config order) that names it, rendered with
// Schema "_control" and Table the control kind; row values render as "_".
func (r *Router) ControlDests(source, kind string) ([]ControlDest, error) {
	pick := func(explicit bool) ([]ControlDest, error) {
		seen := map[int]bool{}
		var out []ControlDest
		for _, rt := range r.routes {
			if len(rt.sources) > 0 && !slices.Contains(rt.sources, source) {
				continue
			}
			if slices.Contains(rt.ops, cdc.OpControl) != explicit {
				continue
			}
			d := SubjectData{Source: Token(source), Schema: cdc.ControlSchema, Table: Token(kind), Op: string(cdc.OpControl),
				Prefix: "_", Key: map[string]string{}, Col: map[string]string{}}
			for _, v := range rt.cols {
				d.Col[v] = "_"
			}
			for _, v := range rt.keys {
				d.Key[v] = "_"
			}
			if len(rt.outs) > 0 {
				d.Out = map[string]string{}
				for _, v := range rt.outs {
					d.Out[v] = "_"
				}
			}
			subj, err := render(rt.subject, d)
			if err != nil {
				return nil, fmt.Errorf("routes[%d].subject for control messages: %w", rt.idx, err)
			}
			for _, s := range rt.sinks {
				if !seen[s] {
					seen[s] = true
					out = append(out, ControlDest{Sink: s, Subject: subj})
				}
			}
		}
		return out, nil
	}
	out, err := pick(true)
	if err != nil || len(out) > 0 {
		return out, err
	}
	return pick(false)
}
