"""The mechanisms: Gaussian noise on pytrees (``gaussian``), clipping (``clipping``, book-keeping
per-example clipping ``ghost_clipping``), the DP-SGD step (``step_dp``), and the upload transforms
that run them and state their typed releases (``upload_clipping``, ``upload_noise``,
``upload_layer_quantile_clip``, ``upload_cuag_noise`` with CUAG-PFL's ``adaptive_gdp``,
``update_statistics``). One module each; import what you use from it."""
