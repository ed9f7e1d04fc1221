package webui

import "net/http"

func (u *UI) registerEvalPages(mux *http.ServeMux) {}
