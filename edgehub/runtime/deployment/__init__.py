"""The deployment: a manifest checked in a short-lived child process (``check``, ``answer``, ``wants``), turned into
what the serving hub runs (``plan``, ``settings``) and applied whole, watched and reported by the
``controller`` (its live state in ``state``). Importing the package imports none of them, so the child that checks
a manifest loads only what the check needs."""
