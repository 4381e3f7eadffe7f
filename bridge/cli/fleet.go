package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/bridgecdc/bridge/bridge/fleet"
	"github.com/bridgecdc/bridge/config"
)

// newFleetCommand is `bridge fleet status <name>`: the fleet's members and
// leases as its bucket holds them.
func newFleetCommand(load func() (*config.Config, error), stdout io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "fleet",
		Short: "Look at a fleet of bridges sharing their sources (bridge run --fleet)",
		Args:  cobra.NoArgs,
	}
	var output string
	var timeout time.Duration
	st := &cobra.Command{
		Use:   "status <fleet>",
		Short: "List a fleet's members and which member holds each source's lease",
		Long: `Read the fleet's bucket (bridge_fleet_<fleet>) on the NATS server of the
configuration: every member (its instance id, when it started, the sources it
holds, how long ago it last wrote its heartbeat) and every source's lease (its
owner, "" when released, the epoch, which grows at each change of owner, and
how long ago it was renewed). A member not renewed for more than the lease
(5s unless --fleet-lease) is shown gone; the other members take a source over
once its lease is 3/4 of the lease old without renewal. Ages come from the
writers' clocks.
` + "`bridge status`" + ` shows what each member's sources are doing.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := load()
			if err != nil {
				return err
			}
			nc, err := dialNATS(cfg, "fleet status")
			if err != nil {
				return fmt.Errorf("the fleet's bucket is on NATS: %w", err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			s, err := fleet.ReadStatus(ctx, js, args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				enc := json.NewEncoder(stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(s)
			}
			printFleet(stdout, s)
			return nil
		},
	}
	st.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	st.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for NATS")
	root.AddCommand(st)
	return root
}

func printFleet(w io.Writer, s fleet.Status) {
	fmt.Fprintf(w, "fleet %s (bucket %s): %d members, %d leases\n\n", s.Fleet, s.Bucket, len(s.Members), len(s.Leases))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MEMBER\tSTATE\tSTARTED\tHEARTBEAT\tSOURCES")
	for _, m := range s.Members {
		state := "live"
		if !m.Live {
			state = "gone"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s ago\t%s\n", m.Member, state, m.Started.Format(time.RFC3339), m.Age, strings.Join(m.Sources, ","))
	}
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tOWNER\tEPOCH\tRENEWED")
	for _, l := range s.Leases {
		owner := l.Owner
		if owner == "" {
			owner = "(released)"
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s ago\n", l.Source, owner, l.Epoch, l.Age)
	}
	_ = tw.Flush()
}
