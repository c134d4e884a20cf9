from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_POST

from shop.models import Order
from shop.tasks import send_receipt


@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    """Write an order and enqueue its receipt in one transaction; with
    fail=1 it raises after both, and neither is kept."""
    with transaction.atomic():
        order = Order.objects.create(item=request.POST["item"])
        result = send_receipt.enqueue(order.id)
        if request.POST.get("fail") == "1":
            raise RuntimeError("refused after the enqueue")
    return JsonResponse({"order": order.id, "task": result.id})
