package webui

import (
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/harmonia-ci/harmonia-ci/internal/nix"
	"github.com/harmonia-ci/harmonia-ci/internal/status"
)

// Badges and "latest" links, the addresses users put in READMEs and download scripts:
//
//	GET /ci/{project}/badge.svg[?branch=B][&attr=A]   a status badge (SVG)
//	GET /ci/{project}/badge.json[?branch=B][&attr=A]  the same as a shields.io endpoint
//	GET /ci/{project}/latest/{attr}                   the latest succeeded build of the default branch
//	GET /ci/{project}/latest/{attr}/output            its output's narinfo
//
// They live under the project's pages, so a private project's are its readers' alone (the
// route's check answers anyone else with the 404 of a project that does not exist).

// Badge is what a badge says: the state of the latest evaluation of a branch, or of one
// attribute in it.
type Badge struct {
	Message string `json:"message"`
	Color   string `json:"color"` // a shields.io colour name
}

// badgeColors are the SVG fills of the colour names Badge uses (shields.io's).
var badgeColors = map[string]string{
	"brightgreen": "#4c1", "red": "#e05d44", "yellow": "#dfb317", "lightgrey": "#9f9f9f",
}

const badgeLabel = "harmonia-ci"

// badgeCounts are an evaluation's attributes by outcome, as sqlBadge counts them.
type badgeCounts struct {
	evalStatus                                status.EvalStatus
	attrs, evalErrors, failed, unfinishedJobs int
}

// badgeFor says what counts c look like on a badge; attr is the attribute asked about ("":
// the whole evaluation).
func badgeFor(c badgeCounts, attr string) Badge {
	switch {
	case c.evalStatus == status.EvalQueued || c.evalStatus == status.EvalRunning:
		return Badge{"evaluating", "yellow"}
	case c.evalStatus == status.EvalFailed:
		return Badge{"evaluation failed", "red"}
	case attr != "" && c.attrs == 0:
		return Badge{"no such attribute", "lightgrey"}
	case c.evalErrors > 0 || c.failed > 0:
		return Badge{"failing", "red"}
	case c.unfinishedJobs > 0:
		return Badge{"building", "yellow"}
	}
	return Badge{"passing", "brightgreen"}
}

// badge answers badge.svg and badge.json.
func (u *UI) badge(w http.ResponseWriter, r *http.Request, asJSON bool) error {
	project, q := r.PathValue("project"), r.URL.Query()
	attr := q.Get("attr")
	var c badgeCounts
	err := u.cfg.Pool.QueryRow(r.Context(), sqlBadge, project, q.Get("branch"), attr).
		Scan(&c.evalStatus, &c.attrs, &c.evalErrors, &c.failed, &c.unfinishedJobs)
	b := badgeFor(c, attr)
	if errors.Is(err, pgx.ErrNoRows) {
		b = Badge{"no evaluation", "lightgrey"}
	} else if err != nil {
		return err
	}
	h := w.Header()
	// Badges change with every evaluation: image proxies (GitHub's camo) must ask again.
	h.Set("Cache-Control", "no-cache, max-age=0")
	if asJSON {
		h.Set("Content-Type", "application/json")
		return json.NewEncoder(w).Encode(struct {
			SchemaVersion int    `json:"schemaVersion"`
			Label         string `json:"label"`
			Badge
		}{1, badgeLabel, b})
	}
	h.Set("Content-Type", "image/svg+xml")
	_, err = w.Write(badgeSVG(badgeLabel, b))
	return err
}

// badgeSVG draws a flat two-part badge; text widths are estimated from the character count
// (Verdana 11px averages about 7 px a character).
func badgeSVG(label string, b Badge) []byte {
	lw, mw := 10+7*len(label), 10+7*len(b.Message)
	fill := badgeColors[b.Color]
	var s strings.Builder
	fmt.Fprintf(&s, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="20" role="img" aria-label="%s: %s">`,
		lw+mw, html.EscapeString(label), html.EscapeString(b.Message))
	fmt.Fprintf(&s, `<title>%s: %s</title>`, html.EscapeString(label), html.EscapeString(b.Message))
	fmt.Fprintf(&s, `<rect width="%d" height="20" rx="3" fill="#555"/><rect x="%d" width="%d" height="20" rx="3" fill="%s"/>`, lw+mw, lw, mw, fill)
	fmt.Fprintf(&s, `<rect x="%d" width="4" height="20" fill="%s"/>`, lw, fill)
	fmt.Fprintf(&s, `<g fill="#fff" text-anchor="middle" font-family="Verdana,DejaVu Sans,sans-serif" font-size="11">`)
	fmt.Fprintf(&s, `<text x="%d" y="14">%s</text><text x="%d" y="14">%s</text></g></svg>`,
		lw/2, html.EscapeString(label), lw+mw/2, html.EscapeString(b.Message))
	return []byte(s.String())
}

// latest redirects to the latest succeeded build of attr on the project's default branch (its
// evaluation when the attribute was cached and built nowhere here), or with output to its
// output's narinfo on this host's cache.
func (u *UI) latest(w http.ResponseWriter, r *http.Request, attr string, output bool) error {
	project := r.PathValue("project")
	var evalID int64
	var jobID *int64
	var outPath string
	err := u.cfg.Pool.QueryRow(r.Context(), sqlLatestSucceeded, project, attr).Scan(&evalID, &jobID, &outPath)
	if errors.Is(err, pgx.ErrNoRows) {
		return notFound("no succeeded build of %q on the default branch of %s", attr, project)
	}
	if err != nil {
		return err
	}
	var to string
	switch {
	case output:
		sp, perr := nix.ParseStorePath(outPath)
		if perr != nil {
			return notFound("the latest build of %q has no output path", attr)
		}
		to = "/" + sp.Hash + ".narinfo"
	case jobID != nil:
		to = fmt.Sprintf("/ci/%s/build/%d", url.PathEscape(project), *jobID)
	default:
		to = fmt.Sprintf("/ci/%s/eval/%d", url.PathEscape(project), evalID)
	}
	// The latest changes with every evaluation: the redirect is not to be kept.
	w.Header().Set("Cache-Control", "no-cache, max-age=0")
	http.Redirect(w, r, to, http.StatusFound)
	return nil
}
