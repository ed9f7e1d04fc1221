package webui

import "net/http"

func (u *UI) registerEvents(mux *http.ServeMux) {}
